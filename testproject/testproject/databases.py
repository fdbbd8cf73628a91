"""Where the demo and the tests find PostgreSQL (placeholder until the embedded helper lands)."""

import os


def database_url() -> str:
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/eddyq")
