"""Durations and ``eddyq_settings``: defaults, ``settings.EDDYQ``, environment overrides, errors."""

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_eddyq.conf import (
    DEFAULTS,
    ENVIRONMENT_VARIABLES,
    EddyqSettings,
    InvalidSettingError,
    SettingProblem,
    eddyq_settings,
)
from django_eddyq.durations import format_duration, parse_duration

DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No EDDYQ_* variable of the developer's shell, and no value cached across tests."""
    for variable in list(os.environ):
        if variable.startswith("EDDYQ_"):
            monkeypatch.delenv(variable)
    eddyq_settings.reload()
    yield
    monkeypatch.undo()
    eddyq_settings.reload()


# parse_duration


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, timedelta(0)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(minutes=3), timedelta(minutes=3)),
        ("90", timedelta(seconds=90)),
        ("1.5", timedelta(seconds=1.5)),
        (".5", timedelta(milliseconds=500)),
        (" 7 ", timedelta(seconds=7)),
        ("0", timedelta(0)),
        ("500ms", timedelta(milliseconds=500)),
        ("15s", timedelta(seconds=15)),
        ("5m", timedelta(minutes=5)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
        ("3w", timedelta(weeks=3)),
        ("1.5h", timedelta(minutes=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1d 2h", timedelta(days=1, hours=2)),
        ("1m 30s 250ms", timedelta(minutes=1, seconds=30, milliseconds=250)),
        ("5 m", timedelta(minutes=5)),
        ("1H30M", timedelta(hours=1, minutes=30)),
        ("500MS", timedelta(milliseconds=500)),
        ("-0", timedelta(0)),
    ],
)
def test_parse_duration_accepts(value: object, expected: timedelta) -> None:
    assert parse_duration(value, name="X") == expected


@pytest.mark.parametrize(
    "value",
    ["5 parsecs", "h", "1x", "", "   ", "1e3", "1 5s", "1h h", "5s1", "--5", True, None, [5]],
)
def test_parse_duration_rejects_what_is_not_a_duration(value: object) -> None:
    with pytest.raises(ValueError, match=r"is not a duration") as raised:
        parse_duration(value, name='EDDYQ["STALE_AFTER"]')
    assert str(raised.value) == (
        f'EDDYQ["STALE_AFTER"]: {value!r} is not a duration '
        "(use seconds or units like 500ms, 15s, 5m, 24h, 7d, 3w)"
    )


@pytest.mark.parametrize("value", [-1, -0.5, "-5s", " -1h ", timedelta(seconds=-1)])
def test_parse_duration_rejects_negative_durations(value: object) -> None:
    with pytest.raises(ValueError, match=re.escape(f"X: {value!r} is negative")):
        parse_duration(value, name="X")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_parse_duration_rejects_infinite_numbers(value: float) -> None:
    with pytest.raises(ValueError, match="is not a finite number of seconds"):
        parse_duration(value, name="X")


@pytest.mark.parametrize("value", [1e20, "9" * 400, f"{10**12}w"])
def test_parse_duration_rejects_durations_too_long_for_timedelta(value: object) -> None:
    with pytest.raises(ValueError, match="is too long a duration"):
        parse_duration(value, name="X")


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(seconds=15), "15s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(days=7), "7d"),
        (timedelta(days=1, seconds=1), "1d1s"),
        (timedelta(seconds=-90), "-1m30s"),
    ],
)
def test_format_duration(duration: timedelta, text: str) -> None:
    assert format_duration(duration) == text
    if duration >= timedelta(0):
        assert parse_duration(text, name="X") == duration


# Defaults

PARSED_DEFAULTS: dict[str, object] = {
    "DATABASE": "default",
    "DEFAULT_QUEUE": "default",
    "MAX_ATTEMPTS": 25,
    "HEARTBEAT_INTERVAL": timedelta(seconds=15),
    "STALE_AFTER": timedelta(seconds=60),
    "POLL_INTERVAL": timedelta(seconds=1),
    "LISTEN_NOTIFY": True,
    "RESCUE_INTERVAL": timedelta(seconds=30),
    "RECOVER_STALE_ON_START": True,
    "SCHEDULER_INTERVAL": timedelta(seconds=5),
    "CLEANER_INTERVAL": timedelta(minutes=5),
    "RETENTION": {
        "completed": timedelta(hours=24),
        "failed": timedelta(days=7),
        "cancelled": timedelta(days=7),
        "batch": timedelta(days=7),
    },
    "QUEUE_CLEANER_INTERVAL": timedelta(hours=1),
    "QUEUE_RETENTION": timedelta(hours=24),
    "WORKER_RETENTION": timedelta(hours=24),
    "ACTIVITY_SAMPLE_INTERVAL": timedelta(minutes=1),
    "ACTIVITY_RETENTION": timedelta(days=8),
    "REINDEX_SCHEDULE": "0 0 * * *",
    "REINDEX_INDEXES": (
        "eddyq_jobs_claim_idx",
        "eddyq_jobs_queue_claim_idx",
        "eddyq_jobs_due_idx",
        "eddyq_jobs_lease_idx",
    ),
    "LEADER_LEASE": timedelta(seconds=30),
    "LEADER_RENEW_INTERVAL": timedelta(seconds=10),
    "PERIODIC": {},
    "QUEUES": {},
    "TASK_MODULES": (),
    "ARGUMENT_CODEC": None,
    "METRICS": False,
}


def current_values() -> dict[str, object]:
    return {key: getattr(eddyq_settings, key) for key in DEFAULTS}


def test_defaults() -> None:
    assert current_values() == PARSED_DEFAULTS
    assert eddyq_settings.LISTEN_NOTIFY is True
    assert eddyq_settings.problems() == []


def test_defaults_are_listed_and_read_only() -> None:
    assert eddyq_settings.defaults is DEFAULTS
    assert DEFAULTS["STALE_AFTER"] == "60s"
    assert list(DEFAULTS) == [name for name in vars(EddyqSettings) if name.isupper()]
    with pytest.raises(TypeError):
        DEFAULTS["STALE_AFTER"] = "1s"  # type: ignore[index]


@override_settings()
def test_missing_eddyq_setting_means_defaults() -> None:
    from django.conf import settings

    delattr(settings, "EDDYQ")
    assert eddyq_settings.MAX_ATTEMPTS == 25
    assert eddyq_settings.problems() == []


# settings.EDDYQ


@override_settings(
    EDDYQ={
        "DATABASE": "other",
        "DEFAULT_QUEUE": "mail:high-priority.v2",
        "MAX_ATTEMPTS": 3,
        "HEARTBEAT_INTERVAL": 5,
        "STALE_AFTER": timedelta(seconds=20),
        "POLL_INTERVAL": "250ms",
        "LISTEN_NOTIFY": False,
        "RECOVER_STALE_ON_START": False,
        "QUEUE_RETENTION": 0,
        "REINDEX_SCHEDULE": "30 3 * * sun",
        "REINDEX_INDEXES": ["my_index"],
        "LEADER_LEASE": "1m",
        "LEADER_RENEW_INTERVAL": "15s",
        "PERIODIC": {"nightly": {"cron": "0 2 * * *", "task": "demo.tasks.nightly"}},
    }
)
def test_configured_values() -> None:
    assert current_values() == PARSED_DEFAULTS | {
        "DATABASE": "other",
        "DEFAULT_QUEUE": "mail:high-priority.v2",
        "MAX_ATTEMPTS": 3,
        "HEARTBEAT_INTERVAL": timedelta(seconds=5),
        "STALE_AFTER": timedelta(seconds=20),
        "POLL_INTERVAL": timedelta(milliseconds=250),
        "LISTEN_NOTIFY": False,
        "RECOVER_STALE_ON_START": False,
        "QUEUE_RETENTION": timedelta(0),
        "REINDEX_SCHEDULE": "30 3 * * sun",
        "REINDEX_INDEXES": ("my_index",),
        "LEADER_LEASE": timedelta(minutes=1),
        "LEADER_RENEW_INTERVAL": timedelta(seconds=15),
        "PERIODIC": {"nightly": {"cron": "0 2 * * *", "task": "demo.tasks.nightly"}},
    }
    assert eddyq_settings.problems() == []


@pytest.mark.parametrize(
    "key",
    [
        "RESCUE_INTERVAL",
        "SCHEDULER_INTERVAL",
        "CLEANER_INTERVAL",
        "QUEUE_CLEANER_INTERVAL",
        "ACTIVITY_SAMPLE_INTERVAL",
    ],
)
@pytest.mark.parametrize("off", [None, 0, "0", "0s", timedelta(0)])
def test_service_interval_of_none_or_zero_turns_the_service_off(key: str, off: object) -> None:
    with override_settings(EDDYQ={key: off}):
        assert getattr(eddyq_settings, key) is None


@override_settings(EDDYQ={"REINDEX_SCHEDULE": None, "REINDEX_INDEXES": ()})
def test_reindexing_can_be_turned_off() -> None:
    assert eddyq_settings.REINDEX_SCHEDULE is None
    assert eddyq_settings.REINDEX_INDEXES == ()


@override_settings(EDDYQ={"RETENTION": {"completed": "2h"}})
def test_partial_retention_merges_with_the_defaults() -> None:
    assert current_values()["RETENTION"] == {
        "completed": timedelta(hours=2),
        "failed": timedelta(days=7),
        "cancelled": timedelta(days=7),
        "batch": timedelta(days=7),
    }


@override_settings(EDDYQ={"RETENTION": {"failed": None, "cancelled": 0}})
def test_retention_of_none_keeps_forever_and_zero_deletes_at_once() -> None:
    assert eddyq_settings.RETENTION["failed"] is None
    assert eddyq_settings.RETENTION["cancelled"] == timedelta(0)
    assert eddyq_settings.RETENTION["completed"] == timedelta(hours=24)


def test_override_settings_replaces_cached_values() -> None:
    assert eddyq_settings.MAX_ATTEMPTS == 25
    with override_settings(EDDYQ={"MAX_ATTEMPTS": 2}):
        assert eddyq_settings.MAX_ATTEMPTS == 2
    assert eddyq_settings.MAX_ATTEMPTS == 25


def test_values_are_cached_until_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eddyq_settings.MAX_ATTEMPTS == 25
    monkeypatch.setenv("EDDYQ_MAX_ATTEMPTS", "4")
    assert eddyq_settings.MAX_ATTEMPTS == 25
    eddyq_settings.reload()
    assert eddyq_settings.MAX_ATTEMPTS == 4


def test_other_settings_changing_keep_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eddyq_settings.MAX_ATTEMPTS == 25
    monkeypatch.setenv("EDDYQ_MAX_ATTEMPTS", "4")
    with override_settings(TIME_ZONE="Europe/Paris"):
        assert eddyq_settings.MAX_ATTEMPTS == 25


# Invalid values in settings.EDDYQ


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("DATABASE", "", "'' is not a database alias"),
        ("DEFAULT_QUEUE", 5, "5 is not a queue name"),
        ("DEFAULT_QUEUE", "", "'' is not a queue name"),
        ("DEFAULT_QUEUE", "has space", "'has space' is not a queue name"),
        ("DEFAULT_QUEUE", "q" * 65, "is not a queue name"),
        ("MAX_ATTEMPTS", "lots", "'lots' is not a whole number of 1 or more"),
        ("MAX_ATTEMPTS", 0, "0 is not a whole number of 1 or more"),
        ("MAX_ATTEMPTS", 2.5, "2.5 is not a whole number of 1 or more"),
        ("MAX_ATTEMPTS", True, "True is not a whole number of 1 or more"),
        ("STALE_AFTER", "5 parsecs", "'5 parsecs' is not a duration"),
        ("STALE_AFTER", 0, "0 is zero; it must be longer"),
        ("STALE_AFTER", None, "None is not a duration"),
        ("HEARTBEAT_INTERVAL", -1, "-1 is negative"),
        ("POLL_INTERVAL", "0s", "'0s' is zero"),
        ("LEADER_LEASE", "forever", "'forever' is not a duration"),
        ("LEADER_RENEW_INTERVAL", "1x", "'1x' is not a duration"),
        ("QUEUE_RETENTION", None, "None is not a duration"),
        ("LISTEN_NOTIFY", "false", "'false' is not True or False"),
        ("METRICS", "yes", "'yes' is not True or False"),
        ("RECOVER_STALE_ON_START", 1, "1 is not True or False"),
        ("RESCUE_INTERVAL", "often", "'often' is not a duration"),
        ("CLEANER_INTERVAL", -5, "-5 is negative"),
        ("REINDEX_SCHEDULE", "at midnight", "'at midnight' is not a cron expression"),
        ("REINDEX_SCHEDULE", 0, "0 is not a cron expression"),
        ("REINDEX_INDEXES", "eddyq_jobs_claim_idx", "is not a list of index names"),
        ("REINDEX_INDEXES", ["ok", ""], "'' in ['ok', ''] is not an index name"),
        ("TASK_MODULES", "myapp.jobs", "is not a list of module names"),
        ("ARGUMENT_CODEC", "codec", "'codec' is not a dotted path"),
        ("TASK_MODULES", ["myapp.jobs", "os system"], "'os system' in"),
        ("PERIODIC", ["nightly"], "is not a dict of names to dicts of options"),
        ("PERIODIC", {"nightly": "0 2 * * *"}, "entry 'nightly' is not a name with a dict"),
    ],
)
def test_invalid_value_names_key_value_and_source(key: str, value: object, message: str) -> None:
    with override_settings(EDDYQ={key: value}):
        with pytest.raises(ImproperlyConfigured) as raised:
            getattr(eddyq_settings, key)
        assert str(raised.value).startswith(f'EDDYQ["{key}"]: ')
        assert message in str(raised.value)
        assert eddyq_settings.problems() == [
            SettingProblem(key, f'EDDYQ["{key}"]', value, str(raised.value))
        ]


@pytest.mark.parametrize(
    ("retention", "message"),
    [
        ("x", "EDDYQ[\"RETENTION\"]: 'x' is not a dict of completed, failed, cancelled, batch"),
        (
            {"complete": "1h"},
            "EDDYQ[\"RETENTION\"]: 'complete' is not a job state with a retention. "
            "Did you mean 'completed'?",
        ),
        ({"failed": "soon"}, 'EDDYQ["RETENTION"]["failed"]: \'soon\' is not a duration'),
        ({"batch": -1}, 'EDDYQ["RETENTION"]["batch"]: -1 is negative'),
    ],
)
def test_invalid_retention(retention: object, message: str) -> None:
    with override_settings(EDDYQ={"RETENTION": retention}):
        with pytest.raises(InvalidSettingError, match=re.escape(message)) as raised:
            _ = eddyq_settings.RETENTION
        assert raised.value.problem.key == "RETENTION"
        assert raised.value.problem.source == 'EDDYQ["RETENTION"]'


@override_settings(EDDYQ="STALE_AFTER=60")
def test_eddyq_setting_that_is_not_a_dict() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"settings\.EDDYQ: 'STALE_AFTER=60' is not"):
        _ = eddyq_settings.STALE_AFTER
    [problem] = eddyq_settings.problems()
    assert problem.key == "EDDYQ"


@override_settings(EDDYQ={"STALE_AFTER": "nope", "MAX_ATTEMPTS": 0, "POLL_INTERVAL": "2s"})
def test_problems_lists_every_invalid_key_without_raising() -> None:
    assert [problem.key for problem in eddyq_settings.problems()] == ["MAX_ATTEMPTS", "STALE_AFTER"]
    assert eddyq_settings.POLL_INTERVAL.total_seconds() == 2


# Environment variables


def test_environment_wins_over_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDDYQ_STALE_AFTER", "90s")
    with override_settings(EDDYQ={"STALE_AFTER": "2m", "POLL_INTERVAL": "2s"}):
        assert eddyq_settings.STALE_AFTER.total_seconds() == 90
        assert eddyq_settings.POLL_INTERVAL.total_seconds() == 2


@pytest.mark.parametrize(
    ("variable", "text", "key", "expected"),
    [
        ("EDDYQ_DATABASE", "replica", "DATABASE", "replica"),
        ("EDDYQ_DEFAULT_QUEUE", "mail", "DEFAULT_QUEUE", "mail"),
        ("EDDYQ_MAX_ATTEMPTS", "5", "MAX_ATTEMPTS", 5),
        ("EDDYQ_MAX_ATTEMPTS", " 5 ", "MAX_ATTEMPTS", 5),
        ("EDDYQ_HEARTBEAT_INTERVAL", "5", "HEARTBEAT_INTERVAL", timedelta(seconds=5)),
        ("EDDYQ_POLL_INTERVAL", "500ms", "POLL_INTERVAL", timedelta(milliseconds=500)),
        ("EDDYQ_LISTEN_NOTIFY", "false", "LISTEN_NOTIFY", False),
        ("EDDYQ_LISTEN_NOTIFY", "Off", "LISTEN_NOTIFY", False),
        ("EDDYQ_LISTEN_NOTIFY", "no", "LISTEN_NOTIFY", False),
        ("EDDYQ_LISTEN_NOTIFY", "0", "LISTEN_NOTIFY", False),
        ("EDDYQ_LISTEN_NOTIFY", "TRUE", "LISTEN_NOTIFY", True),
        ("EDDYQ_LISTEN_NOTIFY", "on", "LISTEN_NOTIFY", True),
        ("EDDYQ_LISTEN_NOTIFY", "yes", "LISTEN_NOTIFY", True),
        ("EDDYQ_LISTEN_NOTIFY", "1", "LISTEN_NOTIFY", True),
        ("EDDYQ_METRICS", "true", "METRICS", True),
        ("EDDYQ_RECOVER_STALE_ON_START", "false", "RECOVER_STALE_ON_START", False),
        ("EDDYQ_RESCUE_INTERVAL", "none", "RESCUE_INTERVAL", None),
        ("EDDYQ_SCHEDULER_INTERVAL", "NULL", "SCHEDULER_INTERVAL", None),
        ("EDDYQ_CLEANER_INTERVAL", "0", "CLEANER_INTERVAL", None),
        ("EDDYQ_QUEUE_CLEANER_INTERVAL", "2h", "QUEUE_CLEANER_INTERVAL", timedelta(hours=2)),
        ("EDDYQ_QUEUE_RETENTION", "1d", "QUEUE_RETENTION", timedelta(days=1)),
        ("EDDYQ_REINDEX_SCHEDULE", "none", "REINDEX_SCHEDULE", None),
        ("EDDYQ_REINDEX_SCHEDULE", "0 4 * * *", "REINDEX_SCHEDULE", "0 4 * * *"),
        ("EDDYQ_REINDEX_INDEXES", "a,b", "REINDEX_INDEXES", ("a", "b")),
        ("EDDYQ_REINDEX_INDEXES", " a , b, ", "REINDEX_INDEXES", ("a", "b")),
        ("EDDYQ_REINDEX_INDEXES", "", "REINDEX_INDEXES", ()),
        ("EDDYQ_TASK_MODULES", "app.jobs, b.tasks", "TASK_MODULES", ("app.jobs", "b.tasks")),
        ("EDDYQ_LEADER_LEASE", "1m", "LEADER_LEASE", timedelta(minutes=1)),
        ("EDDYQ_LEADER_RENEW_INTERVAL", "5s", "LEADER_RENEW_INTERVAL", timedelta(seconds=5)),
    ],
)
def test_environment_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str, key: str, expected: object
) -> None:
    monkeypatch.setenv(variable, text)
    assert getattr(eddyq_settings, key) == expected
    assert eddyq_settings.problems() == []


def test_environment_retention_per_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDDYQ_RETENTION_COMPLETED", "2h")
    monkeypatch.setenv("EDDYQ_RETENTION_FAILED", "forever")
    with override_settings(EDDYQ={"RETENTION": {"completed": "1h", "cancelled": "1d"}}):
        assert current_values()["RETENTION"] == {
            "completed": timedelta(hours=2),
            "failed": None,
            "cancelled": timedelta(days=1),
            "batch": timedelta(days=7),
        }


def test_environment_reads_environ_references(monkeypatch: pytest.MonkeyPatch) -> None:
    # django-environ reads "$NAME" as the value of the variable NAME.
    monkeypatch.setenv("QUEUE_OF_THIS_HOST", "reports")
    monkeypatch.setenv("EDDYQ_DEFAULT_QUEUE", "$QUEUE_OF_THIS_HOST")
    assert eddyq_settings.DEFAULT_QUEUE == "reports"


@pytest.mark.parametrize(
    ("variable", "text", "key", "message"),
    [
        ("EDDYQ_STALE_AFTER", "5 parsecs", "STALE_AFTER", "'5 parsecs' is not a duration"),
        ("EDDYQ_STALE_AFTER", "none", "STALE_AFTER", "'none' is not a duration"),
        ("EDDYQ_MAX_ATTEMPTS", "lots", "MAX_ATTEMPTS", "'lots' is not a whole number"),
        ("EDDYQ_MAX_ATTEMPTS", "0", "MAX_ATTEMPTS", "0 is not a whole number of 1 or more"),
        ("EDDYQ_LISTEN_NOTIFY", "maybe", "LISTEN_NOTIFY", "'maybe' is not a boolean"),
        ("EDDYQ_LISTEN_NOTIFY", "", "LISTEN_NOTIFY", "'' is not a boolean"),
        ("EDDYQ_DEFAULT_QUEUE", "a b", "DEFAULT_QUEUE", "'a b' is not a queue name"),
        ("EDDYQ_DEFAULT_QUEUE", "$UNSET_VARIABLE", "DEFAULT_QUEUE", "UNSET_VARIABLE"),
        ("EDDYQ_REINDEX_SCHEDULE", "daily", "REINDEX_SCHEDULE", "is not a cron expression"),
        ("EDDYQ_RETENTION_BATCH", "-1h", "RETENTION", "'-1h' is negative"),
    ],
)
def test_invalid_environment_variable_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str, key: str, message: str
) -> None:
    monkeypatch.delenv("UNSET_VARIABLE", raising=False)
    monkeypatch.setenv(variable, text)
    with pytest.raises(ImproperlyConfigured) as raised:
        getattr(eddyq_settings, key)
    assert str(raised.value).startswith(f"environment variable {variable}: ")
    assert message in str(raised.value)
    assert eddyq_settings.problems() == [
        SettingProblem(key, f"environment variable {variable}", text, str(raised.value))
    ]


def test_periodic_has_no_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDDYQ_PERIODIC", "{}")
    assert eddyq_settings.PERIODIC == {}
    assert ENVIRONMENT_VARIABLES["PERIODIC"] == ()
    assert ENVIRONMENT_VARIABLES["RETENTION"] == (
        "EDDYQ_RETENTION_COMPLETED",
        "EDDYQ_RETENTION_FAILED",
        "EDDYQ_RETENTION_CANCELLED",
        "EDDYQ_RETENTION_BATCH",
    )


# Documentation


def test_docs_describe_every_setting_and_environment_variable() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for key, variables in ENVIRONMENT_VARIABLES.items():
        assert f"`{key}`" in docs
        for variable in variables:
            assert f"`{variable}`" in docs


def test_docs_example_is_valid() -> None:
    [example] = [
        block
        for block in re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
        if "EDDYQ = {" in block
    ]
    namespace: dict[str, object] = {}
    exec(example, namespace)
    with override_settings(EDDYQ=namespace["EDDYQ"]):
        assert eddyq_settings.problems() == []
