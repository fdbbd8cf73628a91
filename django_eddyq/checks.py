"""System checks of the settings (``manage.py check``); each concern is a function of its own.

The checks report invalid settings and never raise on them.
"""

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, connections
from django.db.utils import load_backend

from django_eddyq import metrics, sql
from django_eddyq.conf import (
    DEFAULTS,
    ENV_PREFIX,
    ENVIRONMENT_VARIABLES,
    did_you_mean,
    eddyq_settings,
)
from django_eddyq.durations import format_duration
from django_eddyq.maintenance.periodic import PeriodicJob

TAG = "django_eddyq"
# The longest window the admin's activity charts show.
ACTIVITY_WEEK = timedelta(days=7)

UNKNOWN_KEY = "django_eddyq.E001"
INVALID_VALUE = "django_eddyq.E002"
HEARTBEAT_TOO_SLOW = "django_eddyq.E003"
LEADER_RENEWAL_TOO_SLOW = "django_eddyq.E004"
UNKNOWN_DATABASE = "django_eddyq.E005"
NOT_POSTGRESQL = "django_eddyq.E006"
UNKNOWN_REINDEX_INDEX = "django_eddyq.E007"
INVALID_PERIODIC_JOB = "django_eddyq.E008"
METRICS_NOT_INSTALLED = "django_eddyq.E009"
UNKNOWN_ENVIRONMENT_VARIABLE = "django_eddyq.W001"
LEADER_RENEWAL_LATE = "django_eddyq.W002"
ACTIVITY_RETENTION_SHORT = "django_eddyq.W003"
CONNECTIONS_NOT_KEPT = "django_eddyq.W004"

# EDDYQ_ variables that are not settings: the system user of django_eddyq.embedded's PostgreSQL,
# the data directory that the test project hands down to the processes it starts, and the
# switch that has tests/test_statements.py rewrite docs/statements.sql.
OTHER_ENVIRONMENT_VARIABLES = frozenset(
    {"EDDYQ_PG_USER", "EDDYQ_EMBEDDED_PGDATA", "EDDYQ_WRITE_STATEMENTS"}
)

type AppConfigs = Sequence[AppConfig] | None


@register(TAG)
def check_unknown_keys(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    configured = getattr(settings, "EDDYQ", {})
    if not isinstance(configured, Mapping):
        return []  # reported by check_values
    return [
        Error(
            f"settings.EDDYQ has an unknown key {key!r}.",
            hint=did_you_mean(str(key), tuple(DEFAULTS)),
            id=UNKNOWN_KEY,
        )
        for key in configured
        if key not in DEFAULTS
    ]


@register(TAG)
def check_unknown_environment_variables(
    app_configs: AppConfigs = None, **kwargs: Any
) -> list[CheckMessage]:
    known = tuple(name for names in ENVIRONMENT_VARIABLES.values() for name in names)
    return [
        Warning(
            f"Environment variable {variable} is not a django_eddyq setting; it is ignored.",
            hint=_environment_variable_hint(variable, known),
            id=UNKNOWN_ENVIRONMENT_VARIABLE,
        )
        for variable in sorted(os.environ)
        if variable.startswith(ENV_PREFIX)
        and variable not in known
        and variable not in OTHER_ENVIRONMENT_VARIABLES
    ]


def _environment_variable_hint(variable: str, known: tuple[str, ...]) -> str:
    key = variable.removeprefix(ENV_PREFIX)
    if key in ENVIRONMENT_VARIABLES:  # a setting without a variable of that name
        if ENVIRONMENT_VARIABLES[key]:
            return f"{key} is set through {', '.join(ENVIRONMENT_VARIABLES[key])}."
        return f"{key} can only be set in settings.EDDYQ."
    return did_you_mean(variable, known)


@register(TAG)
def check_values(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    return [Error(problem.message, id=INVALID_VALUE) for problem in eddyq_settings.problems()]


@register(TAG)
def check_heartbeat(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        heartbeat = eddyq_settings.HEARTBEAT_INTERVAL
        stale_after = eddyq_settings.STALE_AFTER
    except ImproperlyConfigured:
        return []  # reported by check_values
    if heartbeat * 2 <= stale_after:
        return []
    return [
        Error(
            f"HEARTBEAT_INTERVAL ({format_duration(heartbeat)}) is more than half of STALE_AFTER "
            f"({format_duration(stale_after)}): jobs of live workers could be taken for stale.",
            hint="Make STALE_AFTER several times HEARTBEAT_INTERVAL, like 60s and 15s.",
            id=HEARTBEAT_TOO_SLOW,
        )
    ]


@register(TAG)
def check_leader_lease(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        lease = eddyq_settings.LEADER_LEASE
        renew_interval = eddyq_settings.LEADER_RENEW_INTERVAL
    except ImproperlyConfigured:
        return []  # reported by check_values
    durations = (
        f"LEADER_RENEW_INTERVAL ({format_duration(renew_interval)}) "
        f"and LEADER_LEASE ({format_duration(lease)})"
    )
    hint = "Renew the lease several times within it, like every 10s for a 30s lease."
    if renew_interval >= lease:
        return [
            Error(
                f"{durations}: the lease would expire before the leader renews it.",
                hint=hint,
                id=LEADER_RENEWAL_TOO_SLOW,
            )
        ]
    if renew_interval * 2 > lease:
        return [
            Warning(
                f"{durations}: a single late renewal would lose the leadership.",
                hint=hint,
                id=LEADER_RENEWAL_LATE,
            )
        ]
    return []


@register(TAG)
def check_activity_retention(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        retention = eddyq_settings.ACTIVITY_RETENTION
    except ImproperlyConfigured:
        return []  # reported by check_values
    if retention is None or retention >= ACTIVITY_WEEK:
        return []
    return [
        Warning(
            f"ACTIVITY_RETENTION ({format_duration(retention)}) is shorter than the 7 days "
            "the admin's activity chart shows: its older hours stay empty.",
            hint="Keep ACTIVITY_RETENTION at 7 days or more, like its default of 8 days.",
            id=ACTIVITY_RETENTION_SHORT,
        )
    ]


@register(TAG)
def check_database(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        alias = eddyq_settings.DATABASE
    except ImproperlyConfigured:
        return []  # reported by check_values
    if alias not in settings.DATABASES:
        return [
            Error(
                f"DATABASE is {alias!r}, which is not a key of settings.DATABASES.",
                hint=f"Use one of {', '.join(map(repr, settings.DATABASES))}.",
                id=UNKNOWN_DATABASE,
            )
        ]
    engine = settings.DATABASES[alias].get("ENGINE")
    vendor = _vendor(engine)
    if vendor == "postgresql":
        return []
    what = "cannot be loaded" if vendor is None else f"is for {vendor}, not PostgreSQL"
    return [
        Error(
            f"DATABASE {alias!r} uses the backend {engine!r}, which {what}.",
            hint="django_eddyq needs PostgreSQL: 'django.db.backends.postgresql' or a wrapper.",
            id=NOT_POSTGRESQL,
        )
    ]


@register(TAG)
def check_connections_kept(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    """The queue's database and the default one (where handlers' queries go) keep their
    connections: with Django's default, ``CONN_MAX_AGE`` 0 and no pool, every request that
    enqueues and every job that queries opens one (docs/deployment.md#keeping-connections-open).

    Says nothing with ``LISTEN_NOTIFY`` off, which declares a transaction pooler (PgBouncer):
    it keeps the server's connections itself.
    """
    try:
        alias = eddyq_settings.DATABASE
        listening = eddyq_settings.LISTEN_NOTIFY
    except ImproperlyConfigured:
        return []  # reported by check_values
    if not listening:
        return []
    messages: list[CheckMessage] = []
    for name in dict.fromkeys(["default", alias]):
        database: Mapping[str, Any] | None = settings.DATABASES.get(name)
        if database is None:
            continue
        options: Mapping[str, Any] = database.get("OPTIONS") or {}
        if (
            database.get("CONN_MAX_AGE", 0) != 0
            or options.get("pool")
            or _vendor(database.get("ENGINE")) != "postgresql"
        ):
            continue
        messages.append(
            Warning(
                f"DATABASES[{name!r}] opens a connection for every request and every job "
                "(CONN_MAX_AGE is 0, Django's default, and it has no pool).",
                hint=f'Keep them: DATABASES[{name!r}] |= {{"CONN_MAX_AGE": 600, '
                '"CONN_HEALTH_CHECKS": True}, or OPTIONS {"pool": True}. See '
                "docs/deployment.md#keeping-connections-open.",
                id=CONNECTIONS_NOT_KEPT,
            )
        )
    return messages


def _vendor(engine: object) -> str | None:
    """The vendor of the database backend ``engine``, or None if it cannot be loaded."""
    if not isinstance(engine, str) or not engine:
        return None
    # The backend's class knows its vendor without connecting, so wrappers of PostgreSQL's pass.
    try:
        vendor: str = load_backend(engine).DatabaseWrapper.vendor
    except ImproperlyConfigured:
        return None
    return vendor


# Tagged "database" only: it queries the database, so Django runs it when given databases
# (check --database, migrate) or the "database" tag, never in a plain check.
@register(Tags.database)
def check_reindex_indexes(
    app_configs: AppConfigs = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """REINDEX_INDEXES names only indexes of eddyq_jobs; the reindexer would skip the others.

    Says nothing when the names are the default ones, when the queue's database is not among
    ``databases``, can't be reached, or has no eddyq_jobs yet (before migrate).
    """
    try:
        alias = eddyq_settings.DATABASE
        names = eddyq_settings.REINDEX_INDEXES
    except ImproperlyConfigured:
        return []  # reported by check_values
    if not names or not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    if names == DEFAULTS["REINDEX_INDEXES"]:
        # The migrations create them: nothing to ask the database, which a worker would open
        # a connection for before its first claim.
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []  # reported by check_database
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql.REINDEX_UNKNOWN_INDEXES, {"names": list(names)})
            unknown = [name for (name,) in cursor.fetchall()]
    except (DatabaseError, InterfaceError):
        return []
    return [
        Error(
            f"REINDEX_INDEXES names {name!r}, which is not an index of eddyq_jobs.",
            hint="The reindexer skips it. psql's \\d eddyq_jobs lists the table's indexes.",
            id=UNKNOWN_REINDEX_INDEX,
        )
        for name in unknown
    ]


@register(TAG)
def check_periodic_jobs(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    """Every schedule of PERIODIC is well formed and names a registered task."""
    try:
        periodic = eddyq_settings.PERIODIC
    except ImproperlyConfigured:
        return []  # reported by check_values
    errors: list[CheckMessage] = []
    for name, options in periodic.items():
        try:
            PeriodicJob.from_setting(name, options)
        except ValueError as error:
            errors.append(
                Error(str(error), hint="See docs/maintenance.md.", id=INVALID_PERIODIC_JOB)
            )
    return errors


@register(TAG)
def check_metrics_installed(app_configs: AppConfigs = None, **kwargs: Any) -> list[CheckMessage]:
    """METRICS needs prometheus-client, which is an optional extra."""
    try:
        wanted = eddyq_settings.METRICS
    except ImproperlyConfigured:
        return []  # reported by check_values
    if not wanted or metrics.installed():
        return []
    return [
        Error(
            "METRICS is on but prometheus-client is not installed.",
            hint=metrics.INSTALL,
            id=METRICS_NOT_INSTALLED,
        )
    ]
