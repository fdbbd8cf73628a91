"""The system checks of the settings, run as ``manage.py check`` runs them."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.checks import CheckMessage, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_eddyq import checks
from django_eddyq.conf import eddyq_settings
from tests import jobs  # noqa: F401 - registers the tasks the schedules below name

DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
CHECK_IDS = {f"django_eddyq.E00{number}" for number in range(1, 7)} | {
    "django_eddyq.W001",
    "django_eddyq.W002",
    "django_eddyq.W003",
    "django_eddyq.W004",
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No EDDYQ_* variable of the developer's shell, and no value cached across tests; the
    default database keeps its connections (the test project's does not, see W004 below)."""
    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 600)
    for variable in list(os.environ):
        if variable.startswith("EDDYQ_"):
            monkeypatch.delenv(variable)
    eddyq_settings.reload()
    yield
    monkeypatch.undo()
    eddyq_settings.reload()


def eddyq_messages() -> list[CheckMessage]:
    eddyq_settings.reload()  # the environment may have changed since values were cached
    return [message for message in run_checks(tags=[checks.TAG]) if message.id in CHECK_IDS]


def only_message() -> CheckMessage:
    [message] = eddyq_messages()
    return message


def test_clean_configuration_has_no_messages() -> None:
    assert eddyq_messages() == []


@override_settings(
    EDDYQ={
        "HEARTBEAT_INTERVAL": "5s",
        "STALE_AFTER": "10s",
        "LEADER_LEASE": "20s",
        "LEADER_RENEW_INTERVAL": "10s",
        "RETENTION": {"completed": None},
        "RESCUE_INTERVAL": None,
    }
)
def test_limits_that_are_just_right_have_no_messages() -> None:
    assert eddyq_messages() == []


@override_settings(EDDYQ={"STALE_AFTR": "1m"})
def test_checks_run_with_the_check_command() -> None:
    with pytest.raises(SystemCheckError, match=r"django_eddyq\.E001"):
        call_command("check")


# E001: unknown key


@override_settings(EDDYQ={"STALE_AFTR": "1m"})
def test_unknown_key_suggests_the_closest() -> None:
    message = only_message()
    assert message.id == "django_eddyq.E001"
    assert message.is_serious()
    assert message.msg == "settings.EDDYQ has an unknown key 'STALE_AFTR'."
    assert message.hint == "Did you mean 'STALE_AFTER'?"


@override_settings(EDDYQ={"stale_after": "1m"})
def test_unknown_key_in_lower_case_suggests_upper_case() -> None:
    assert only_message().hint == "Did you mean 'STALE_AFTER'?"


@override_settings(EDDYQ={"COLOUR": "blue", 3: "x"})
def test_unknown_keys_without_close_match_list_the_known_ones() -> None:
    messages = eddyq_messages()
    assert [message.msg for message in messages] == [
        "settings.EDDYQ has an unknown key 'COLOUR'.",
        "settings.EDDYQ has an unknown key 3.",
    ]
    assert all(
        str(message.hint).startswith("Known: DATABASE, DEFAULT_QUEUE,") for message in messages
    )


# E002: invalid value


@override_settings(EDDYQ={"STALE_AFTER": "5 parsecs", "MAX_ATTEMPTS": "lots"})
def test_invalid_values_are_one_error_each() -> None:
    messages = eddyq_messages()
    assert {message.id for message in messages} == {"django_eddyq.E002"}
    assert [message.msg for message in messages] == [
        "EDDYQ[\"MAX_ATTEMPTS\"]: 'lots' is not a whole number of 1 or more",
        "EDDYQ[\"STALE_AFTER\"]: '5 parsecs' is not a duration "
        "(use seconds or units like 500ms, 15s, 5m, 24h, 7d, 3w)",
    ]


def test_invalid_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDDYQ_LISTEN_NOTIFY", "perhaps")
    message = only_message()
    assert message.id == "django_eddyq.E002"
    assert message.msg.startswith("environment variable EDDYQ_LISTEN_NOTIFY: 'perhaps'")


@override_settings(EDDYQ=["STALE_AFTER", 60])
def test_eddyq_setting_that_is_not_a_dict() -> None:
    message = only_message()
    assert message.id == "django_eddyq.E002"
    assert message.msg == "settings.EDDYQ: ['STALE_AFTER', 60] is not a dict"


@override_settings(
    EDDYQ={
        "DATABASE": 5,
        "HEARTBEAT_INTERVAL": "?",
        "LEADER_LEASE": "?",
        "RETENTION": {"kept": 1},
        "PERIODIC": "x",
    }
)
def test_checks_of_related_values_skip_invalid_ones() -> None:
    assert {message.id for message in eddyq_messages()} == {"django_eddyq.E002"}


# E003: heartbeat


@override_settings(EDDYQ={"HEARTBEAT_INTERVAL": "31s", "STALE_AFTER": "1m"})
def test_heartbeat_more_than_half_of_stale_after() -> None:
    message = only_message()
    assert message.id == "django_eddyq.E003"
    assert message.msg.startswith("HEARTBEAT_INTERVAL (31s) is more than half of STALE_AFTER (1m):")


def test_heartbeat_from_the_environment_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDDYQ_STALE_AFTER", "20s")
    assert only_message().id == "django_eddyq.E003"


# E004 and W002: leader lease


@pytest.mark.parametrize("renew_interval", ["30s", "1m"])
def test_leader_renew_interval_not_below_lease(renew_interval: str) -> None:
    with override_settings(EDDYQ={"LEADER_LEASE": "30s", "LEADER_RENEW_INTERVAL": renew_interval}):
        message = only_message()
    assert message.id == "django_eddyq.E004"
    assert message.is_serious()
    assert "the lease would expire before the leader renews it" in message.msg


@override_settings(EDDYQ={"LEADER_LEASE": "30s", "LEADER_RENEW_INTERVAL": "20s"})
def test_leader_renew_interval_above_half_the_lease() -> None:
    message = only_message()
    assert message.id == "django_eddyq.W002"
    assert not message.is_serious()
    assert message.msg == (
        "LEADER_RENEW_INTERVAL (20s) and LEADER_LEASE (30s): "
        "a single late renewal would lose the leadership."
    )


# W003: activity retention


@pytest.mark.parametrize(("retention", "warned"), [("6d", True), ("7d", False), (None, False)])
def test_activity_retention_shorter_than_the_charts_week(retention: str, warned: bool) -> None:
    with override_settings(EDDYQ={"ACTIVITY_RETENTION": retention}):
        messages = eddyq_messages()
    if not warned:
        assert messages == []
        return
    [message] = messages
    assert message.id == "django_eddyq.W003"
    assert not message.is_serious()
    assert "ACTIVITY_RETENTION (6d) is shorter than the 7 days" in message.msg


# E005 and E006: database


@override_settings(EDDYQ={"DATABASE": "jobs"})
def test_database_alias_not_in_databases() -> None:
    message = only_message()
    assert message.id == "django_eddyq.E005"
    assert message.msg == "DATABASE is 'jobs', which is not a key of settings.DATABASES."
    assert message.hint == "Use one of 'default'."


@pytest.mark.parametrize(
    ("engine", "reason"),
    [
        ("django.db.backends.sqlite3", "which is for sqlite, not PostgreSQL"),
        ("django.db.backends.dummy", "which is for unknown, not PostgreSQL"),
        ("no.such.backend", "which cannot be loaded"),
        (None, "which cannot be loaded"),
    ],
)
def test_database_that_is_not_postgresql(
    monkeypatch: pytest.MonkeyPatch, engine: str | None, reason: str
) -> None:
    monkeypatch.setitem(settings.DATABASES, "local", {"ENGINE": engine, "NAME": ":memory:"})
    with override_settings(EDDYQ={"DATABASE": "local"}):
        message = only_message()
    assert message.id == "django_eddyq.E006"
    assert message.msg == f"DATABASE 'local' uses the backend {engine!r}, {reason}."


def test_database_may_be_another_postgresql_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        settings.DATABASES,
        "jobs",
        {"ENGINE": "django.db.backends.postgresql", "CONN_MAX_AGE": 600},
    )
    monkeypatch.setenv("EDDYQ_DATABASE", "jobs")
    assert eddyq_messages() == []


# W001: unknown environment variable


def test_unknown_environment_variable_suggests_the_closest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EDDYQ_STALE_AFTR", "1m")
    message = only_message()
    assert message.id == "django_eddyq.W001"
    assert not message.is_serious()
    assert message.msg == (
        "Environment variable EDDYQ_STALE_AFTR is not a django_eddyq setting; it is ignored."
    )
    assert message.hint == "Did you mean 'EDDYQ_STALE_AFTER'?"


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("EDDYQ_PERIODIC", "PERIODIC can only be set in settings.EDDYQ."),
        (
            "EDDYQ_RETENTION",
            "RETENTION is set through EDDYQ_RETENTION_COMPLETED, EDDYQ_RETENTION_FAILED, "
            "EDDYQ_RETENTION_CANCELLED, EDDYQ_RETENTION_BATCH.",
        ),
        ("EDDYQ_RETENTION_COMPLETE", "Did you mean 'EDDYQ_RETENTION_COMPLETED'?"),
    ],
)
def test_environment_variable_of_a_setting_set_otherwise(
    monkeypatch: pytest.MonkeyPatch, variable: str, hint: str
) -> None:
    monkeypatch.setenv(variable, "x")
    message = only_message()
    assert message.id == "django_eddyq.W001"
    assert message.hint == hint


@pytest.mark.parametrize("variable", ["EDDYQ_PG_USER", "EDDYQ_EMBEDDED_PGDATA"])
def test_environment_variables_of_the_embedded_postgresql_are_not_reported(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "x")
    assert eddyq_messages() == []


# W004: connections not kept


def test_a_database_that_reconnects_for_every_request_and_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 0)
    message = only_message()
    assert message.id == "django_eddyq.W004"
    assert not message.is_serious()
    assert message.msg == (
        "DATABASES['default'] opens a connection for every request and every job "
        "(CONN_MAX_AGE is 0, Django's default, and it has no pool)."
    )
    assert message.hint == (
        """Keep them: DATABASES['default'] |= {"CONN_MAX_AGE": 600, "CONN_HEALTH_CHECKS": """
        """True}, or OPTIONS {"pool": True}. See docs/deployment.md#keeping-connections-open."""
    )


def test_the_queue_s_own_database_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        settings.DATABASES, "jobs", {"ENGINE": "django.db.backends.postgresql", "NAME": "jobs"}
    )
    with override_settings(EDDYQ={"DATABASE": "jobs"}):
        message = only_message()
    assert message.id == "django_eddyq.W004"
    assert message.msg.startswith("DATABASES['jobs'] opens a connection")


@pytest.mark.parametrize(
    "kept",
    [
        {"CONN_MAX_AGE": None},  # persistent
        {"CONN_MAX_AGE": 0, "OPTIONS": {"pool": True}},
        {"CONN_MAX_AGE": 0, "OPTIONS": {"pool": {"min_size": 2}}},
    ],
)
def test_connections_kept_by_age_or_by_a_pool_pass(
    monkeypatch: pytest.MonkeyPatch, kept: dict[str, object]
) -> None:
    database = {**settings.DATABASES["default"], **kept}
    monkeypatch.setitem(settings.DATABASES, "default", database)
    assert eddyq_messages() == []


def test_no_warning_behind_a_transaction_pooler(monkeypatch: pytest.MonkeyPatch) -> None:
    """LISTEN_NOTIFY off declares PgBouncer in transaction mode, which keeps the connections."""
    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 0)
    with override_settings(EDDYQ={"LISTEN_NOTIFY": False}):
        assert eddyq_messages() == []


def test_a_database_that_is_not_postgresql_is_left_to_its_own_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        settings.DATABASES, "local", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    )
    with override_settings(EDDYQ={"DATABASE": "local"}):
        assert [message.id for message in eddyq_messages()] == ["django_eddyq.E006"]


# Documentation


def test_docs_describe_every_check() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for check_id in CHECK_IDS:
        assert f"`{check_id}`" in docs


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"task": "tests.jobs.add", "cron": "every minute"}, "cron expression 'every minute'"),
        ({"task": "tests.jobs.no_such_task", "cron": "* * * * *"}, "is not a registered task"),
        ({"task": "no.such.module.task", "cron": "* * * * *"}, "is not a registered task"),
        ({"task": "tests.jobs.add", "cron": "* * * * *", "timezone": "Nowhere/Else"}, "timezone"),
    ],
)
def test_invalid_periodic_schedules_are_errors(schedule: dict[str, object], message: str) -> None:
    with override_settings(EDDYQ={"PERIODIC": {"nightly": schedule}}):
        errors = [e for e in run_checks() if e.id == "django_eddyq.E008"]
    assert len(errors) == 1
    assert message in errors[0].msg
    assert "nightly" in errors[0].msg


def test_valid_periodic_schedules_pass() -> None:
    schedule = {"task": "tests.jobs.add", "cron": "*/5 * * * *", "args": [1, 2]}
    with override_settings(EDDYQ={"PERIODIC": {"every-5": schedule}}):
        assert [e for e in run_checks() if e.id == "django_eddyq.E008"] == []
