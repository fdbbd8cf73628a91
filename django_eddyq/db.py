"""The queue's own connections, apart from the ones Django lends to user code, the database's
clock, and statements sent in the numbered form PostgreSQL takes.

The worker's bookkeeping (claims, heartbeats, completions) runs on connections of its own, made
from the queue database's Django settings, so that a handler that breaks its transaction can
never break the worker.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
from django.db import connections
from psycopg.types.json import set_json_dumps, set_json_loads

from django_eddyq import sql
from django_eddyq.arguments import dumps, loads
from django_eddyq.conf import eddyq_settings

# Django-only keys of the connection parameters; psycopg must not see them.
_DJANGO_ONLY_PARAMS = ("cursor_factory", "context")


def connection_params(alias: str | None = None) -> dict[str, Any]:
    connection = connections[alias or eddyq_settings.DATABASE]
    params = connection.get_connection_params()
    for key in _DJANGO_ONLY_PARAMS:
        params.pop(key, None)
    params.setdefault("application_name", "django-eddyq")
    params["prepare_threshold"] = prepare_threshold(alias)
    return params


def prepare_threshold(alias: str | None = None) -> int | None:
    """After how many runs psycopg prepares the queue's own statements (None: never).

    Django turns prepared statements off for poolers' sake, unless its OPTIONS say otherwise;
    the queue's few hot statements gain from them, except behind PgBouncer in transaction
    mode, which is what LISTEN_NOTIFY=False declares.
    """
    options = connections[alias or eddyq_settings.DATABASE].settings_dict["OPTIONS"]
    if "prepare_threshold" in options:
        return cast("int | None", options["prepare_threshold"])
    return 5 if eddyq_settings.LISTEN_NOTIFY else None


def connect(alias: str | None = None) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection: each statement is its own short transaction.

    Its JSON goes through ``arguments.dumps`` and ``loads``, so that the floats of claimed
    arguments and of stored results come back as the same floats.
    """
    connection = psycopg.connect(**connection_params(alias), autocommit=True)
    set_json_dumps(dumps, connection)
    set_json_loads(loads, connection)
    return connection


def database_now(cursor: Any) -> datetime:
    """Now by the database's clock, in UTC, read on ``cursor`` (a Django or psycopg cursor):
    schedules and durations ago are reckoned by it, never by the clock of a process."""
    cursor.execute(sql.DATABASE_NOW)
    (now,) = cursor.fetchone()
    now_utc: datetime = now.astimezone(UTC)
    return now_utc


# A named parameter, or an escaped percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def numbered_parameters(statement: str) -> tuple[str, list[str]]:
    """``statement`` as PostgreSQL takes it: its named parameters (``%(name)s``) numbered
    ``$1``, ``$2``... in order of first appearance, its ``%%`` a ``%``; and the parameters'
    names in that order."""
    names: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PLACEHOLDER.sub(replace, statement), names


@dataclasses.dataclass(frozen=True, slots=True)
class NumberedStatement:
    """A statement of named parameters, converted once to the numbered form psycopg sends.

    psycopg converts a statement's parameters at each execution, and caches that only for
    statements of under 4 KB: longer ones (the keyed claim's) were split again at every pass.
    """

    text: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, statement: str) -> NumberedStatement:
        text, names = numbered_parameters(statement)
        return cls(text, tuple(names))

    def send(
        self, connection: psycopg.Connection[tuple[Any, ...]], params: Mapping[str, Any]
    ) -> psycopg.Cursor[tuple[Any, ...]]:
        """Run it on ``connection`` (in a pipeline too), its parameters taken from ``params``."""
        cursor = psycopg.RawCursor(connection)
        cursor.execute(self.text, [params[name] for name in self.names])
        return cursor
