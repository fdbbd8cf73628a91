"""Bad input, clear error, nothing lost: property-based tests (hypothesis).

* Enqueue arguments: every valid value round-trips through the table exactly (same types, same
  values, floats to the bit); every invalid one raises a ``TypeError`` naming the argument, the
  path inside it and what is wrong, and inserts nothing, even from a whole ``enqueue_many``.
* Settings: durations and the other kinds of value, from ``EDDYQ`` and from the environment.
* Rows edited by hand (unknown task path, malformed args or kwargs): the job fails, with an error
  naming the problem, and the worker carries on.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import math
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from django_eddyq.arguments import revive
from django_eddyq.conf import DEFAULTS, InvalidSettingError, eddyq_settings
from django_eddyq.durations import format_duration, parse_duration
from django_eddyq.models import Job
from django_eddyq.vocabulary import QUEUE_NAME
from django_eddyq.worker import Worker
from tests import jobs
from tests.conftest import FAST_SETTINGS
from tests.faults.conftest import Fleet, wait_until

# The same examples on every run (derandomize), so that the suite is deterministic; nothing
# is written to .hypothesis/.
FAST = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# JSON values as Python holds them: what enqueue must store exactly.
texts = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12
)
offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: datetime.timezone(datetime.timedelta(minutes=minutes))
)
plain_json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_leaves = (
    plain_json_leaves
    # Stored as tagged objects, and revived for the task.
    | st.uuids()
    | st.datetimes()
    | st.datetimes(timezones=offsets)
    | st.dates()
    | st.times()
    | st.times(timezones=offsets)
    | st.decimals(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(texts, children, max_size=4)
    ),
    max_leaves=12,
)
keyword_names = texts.filter(lambda name: name != "self")


def as_stored(value: Any) -> Any:
    """What ``value`` should come back as: tuples become lists, nothing else changes."""
    if isinstance(value, list | tuple):
        return [as_stored(item) for item in value]
    if isinstance(value, dict):
        return {key: as_stored(item) for key, item in value.items()}
    return value


def differences(stored: Any, expected: Any, path: str = "") -> list[str]:
    """Where ``stored`` is not exactly ``expected``: type, value, sign of zero, keys."""
    if type(stored) is not type(expected):
        return [f"{path or 'value'}: {expected!r} came back as {stored!r}"]
    if isinstance(expected, float):
        same = stored == expected and math.copysign(1, stored) == math.copysign(1, expected)
        return [] if same else [f"{path or 'value'}: {expected!r} came back as {stored!r}"]
    if isinstance(expected, list):
        if len(stored) != len(expected):
            return [f"{path}: {expected!r} came back as {stored!r}"]
        return [
            found
            for index, (item, want) in enumerate(zip(stored, expected, strict=True))
            for found in differences(item, want, f"{path}[{index}]")
        ]
    if isinstance(expected, dict):
        if stored.keys() != expected.keys():
            return [f"{path}: keys {sorted(expected)} came back as {sorted(stored)}"]
        return [
            found
            for key in expected
            for found in differences(stored[key], expected[key], f"{path}[{key!r}]")
        ]
    return [] if stored == expected else [f"{path}: {expected!r} came back as {stored!r}"]


def job_count() -> int:
    return Job.all_objects.count()


# Enqueue arguments.


@pytest.mark.django_db
@FAST
@given(
    args=st.lists(json_values, max_size=4),
    kwargs=st.dictionaries(keyword_names, json_values, max_size=3),
)
@example(args=[1e16], kwargs={})
@example(args=[-0.0], kwargs={})
@example(args=[{"$uuid": "not one"}, {"$": 1}], kwargs={"$dict": {"$dict": 2}})
def test_valid_arguments_round_trip_exactly(args: list[Any], kwargs: dict[str, Any]) -> None:
    job = jobs.echo.enqueue(*args, **kwargs)
    stored = Job.all_objects.values_list("args", "kwargs").get(pk=job.pk)
    # What the task gets: the stored JSON, its tagged values revived.
    args_stored, kwargs_stored = stored
    received = [
        [revive(item) for item in args_stored],
        {name: revive(item) for name, item in kwargs_stored.items()},
    ]
    assert differences(received, [as_stored(args), as_stored(kwargs)]) == []


class Bad:
    """A value enqueue must refuse (made on demand: some cannot even be repr()'d), and a word
    its error must contain."""

    def __init__(self, label: str, make: Callable[[], Any], says: str) -> None:
        self.label = label
        self.make = make
        self.says = says

    def __repr__(self) -> str:
        return f"Bad({self.label})"


BAD_VALUES = [
    Bad("object()", object, "object"),
    Bad("a set", lambda: {1, 2}, "set"),
    Bad("bytes", lambda: b"bytes", "bytes"),
    Bad("nan", lambda: float("nan"), "nan"),
    Bad("inf", lambda: float("inf"), "inf"),
    Bad("-inf", lambda: float("-inf"), "inf"),
    Bad("a Decimal NaN", lambda: decimal.Decimal("NaN"), "Decimal NaN"),
    Bad("a Decimal infinity", lambda: decimal.Decimal("-Infinity"), "Decimal -Infinity"),
    Bad("a timedelta", lambda: datetime.timedelta(seconds=1), "timedelta"),
    Bad("a complex", lambda: 1j, "complex"),
    Bad("a string with NUL", lambda: "a\x00b", "NUL"),
    Bad("an int key", lambda: {1: "one"}, "int"),
    Bad("a key with NUL", lambda: {"a\x00": 1}, "NUL"),
    # Values jsonb cannot take, though Python's json module writes them.
    Bad("a lone surrogate", lambda: "lone \ud800 surrogate", "surrogate"),
    Bad("an int of 5001 digits", lambda: 10**5000, "digits"),
]


class Hole:
    """Where the invalid value goes in a drawn container."""

    def __repr__(self) -> str:
        return "<the invalid value>"


def fill(template: Any, value: Any) -> Any:
    if isinstance(template, Hole):
        return value
    if isinstance(template, list | tuple):
        return type(template)(fill(item, value) for item in template)
    if isinstance(template, dict):
        return {key: fill(item, value) for key, item in template.items()}
    return template


@st.composite
def placed(draw: st.DrawFn) -> tuple[Any, str, Bad]:
    """An invalid value somewhere inside valid containers: (the containers with a hole where
    it goes, its path, it)."""
    bad = draw(st.sampled_from(BAD_VALUES))
    value: Any = Hole()
    path = ""
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            before = draw(st.lists(json_values, max_size=2))
            after = draw(st.lists(json_values, max_size=2))
            path = f"[{len(before)}]{path}"
            container = [*before, value, *after]
            value = tuple(container) if draw(st.booleans()) else container
        else:
            key = draw(texts)
            others = draw(
                st.dictionaries(texts.filter(lambda k, key=key: k != key), json_values, max_size=2)
            )
            path = f"[{key!r}]{path}"
            value = {**others, key: value}
    return value, path, bad


@contextlib.contextmanager
def nothing_inserted() -> Iterator[None]:
    before = job_count()
    yield
    assert job_count() == before


@pytest.mark.django_db
@FAST
@given(
    where=placed(),
    position=st.integers(0, 2),
    keyword=keyword_names,
    as_keyword=st.booleans(),
)
def test_invalid_arguments_raise_an_error_naming_them_and_insert_nothing(
    where: tuple[Any, str, Bad], position: int, keyword: str, as_keyword: bool
) -> None:
    template, path, bad = where
    value = fill(template, bad.make())
    if as_keyword:
        args: list[Any] = []
        kwargs = {keyword: value}
        named = f"argument {keyword!r}{path}"
    else:
        args = [None] * position + [value]
        kwargs = {}
        named = f"argument {position}{path}"
    with nothing_inserted(), pytest.raises(TypeError) as raised, transaction.atomic():
        jobs.echo.enqueue(*args, **kwargs)
    message = str(raised.value)
    assert named in message and bad.says in message, message

    # One bad call among good ones: none of them is inserted.
    with nothing_inserted(), pytest.raises(TypeError), transaction.atomic():
        jobs.echo.enqueue_many([(1,), {"a": 2}, (*args, *kwargs.values()), (3,)])


TRICKY_STRINGS = [
    "",
    "\\",
    "\\N",
    "\t",
    "\n",
    "\r\n",
    "a\\.b",
    '"',
    "'",
    "\u2028",
    "é",
    "🦆",
    "\x7f",
]


@pytest.mark.django_db
def test_a_large_enqueue_many_round_trips_and_refuses_like_a_small_one() -> None:
    """From a thousand jobs, enqueue_many takes another road (COPY): the same values must come
    back, and one invalid value must still insert nothing."""
    values = [
        [text, n, n + 0.5, {"key": [text, None, True]}]
        for n, text in enumerate(TRICKY_STRINGS * 100)
    ]
    created = jobs.echo.enqueue_many([(value,) for value in values])
    stored = dict(
        Job.all_objects.filter(pk__in=[job.pk for job in created]).values_list("id", "args")
    )
    for job, value in zip(created, values, strict=True):
        assert differences(stored[job.pk], [value]) == []

    calls = [(value,) for value in values]
    with (
        nothing_inserted(),
        pytest.raises(TypeError, match=r"argument 0\[1\] is an object of type object"),
        transaction.atomic(),
    ):
        jobs.echo.enqueue_many([*calls[:600], ([1, object()],), *calls[600:]])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "make",
    [lambda: "lone \ud800 surrogate", lambda: "\udfff", lambda: 10**5000],
    ids=["high surrogate", "low surrogate", "5001 digits"],
)
def test_values_python_json_writes_but_jsonb_refuses_fail_before_the_database(
    make: Callable[[], Any],
) -> None:
    """Refused like NUL is, by name, not by the database (which would abort the transaction),
    nor by ``json.dumps`` deep in psycopg (which names no argument)."""
    with transaction.atomic():  # the caller's transaction
        with (
            nothing_inserted(),
            pytest.raises(TypeError, match=r"argument 'payload'\[0\]"),
            transaction.atomic(),
        ):
            jobs.echo.enqueue(payload=[make()])
        jobs.add.enqueue(1, 2)  # which carries on


@pytest.mark.django_db
def test_a_keyword_name_containing_nul_is_refused_by_name() -> None:
    with nothing_inserted(), pytest.raises(TypeError, match="NUL"), transaction.atomic():
        jobs.echo.enqueue(**{"a\x00b": 1})


@pytest.mark.django_db
@pytest.mark.parametrize("value", [1e16, 1.5e300, -1e22, -0.0], ids=repr)
def test_floats_come_back_as_the_same_floats(value: float) -> None:
    """jsonb keeps numbers as numerics: 1e16 is written as 1e+16 and read back as the integer
    10000000000000000, and -0.0 as 0.0. A float argument must come back a float, bit for bit."""
    job = jobs.echo.enqueue(value)
    [stored] = Job.all_objects.get(pk=job.pk).args
    assert type(stored) is float and math.copysign(1, stored) == math.copysign(1, value)
    assert stored == value


@pytest.mark.django_db
@FAST
@given(name=st.text(max_size=70) | st.from_regex(QUEUE_NAME, fullmatch=True))
def test_queue_names_are_validated(name: str) -> None:
    if QUEUE_NAME.fullmatch(name):
        assert Job.all_objects.get(pk=jobs.add.using(queue=name).enqueue(1, 2).pk).queue == name
    else:
        with nothing_inserted(), pytest.raises(ValueError, match="queue name") as raised:
            jobs.add.using(queue=name).enqueue(1, 2)
        assert repr(name) in str(raised.value)


@pytest.mark.django_db
@FAST
@given(priority=st.integers(-300, 300) | st.booleans() | st.floats(-100, 100))
def test_priorities_are_validated(priority: Any) -> None:
    if type(priority) is int and -100 <= priority <= 100:
        job = jobs.add.using(priority=priority).enqueue(1, 2)
        assert Job.all_objects.get(pk=job.pk).priority == priority
    else:
        with nothing_inserted(), pytest.raises(ValueError, match="priority") as raised:
            jobs.add.using(priority=priority).enqueue(1, 2)
        assert repr(priority) in str(raised.value)


# Settings.

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
numbers = st.from_regex(r"\A(\d{1,5}(\.\d{0,4})?|\.\d{1,4})\Z")


@st.composite
def unit_strings(draw: st.DrawFn) -> tuple[str, float]:
    """A duration as people write it ("1h 30m", "1.5S"), and its seconds."""
    parts = draw(
        st.lists(st.tuples(numbers, st.sampled_from(sorted(UNITS))), min_size=1, max_size=4)
    )
    text = ""
    seconds = 0.0
    for number, unit in parts:
        spaced = draw(st.sampled_from(["", " "]))
        text += f"{spaced}{number}{spaced}{draw(st.sampled_from([unit, unit.upper()]))}"
        seconds += float(number) * UNITS[unit]
    return text, seconds


valid_durations = (
    st.integers(0, 10**9).map(lambda n: (n, float(n)))
    | st.floats(0, 1e9, allow_nan=False).map(lambda x: (x, x))
    | numbers.map(lambda text: (f" {text} ", float(text)))
    | st.timedeltas(min_value=datetime.timedelta(0)).map(lambda d: (d, d.total_seconds()))
    | unit_strings()
)
BAD_SUFFIXES = ["x", "5", "5.5", "..", "-1s", "1e3s", "1 x", "%", "ms5"]
invalid_durations = (
    st.integers(max_value=-1)
    | st.floats(max_value=-1e-3, allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        [float("nan"), float("inf"), float("-inf"), True, False, None, "", " ", "-5s"]
    )
    | st.lists(st.integers(), max_size=2)
    | st.builds(
        lambda text, suffix: text + suffix,
        unit_strings().map(lambda pair: pair[0]),
        st.sampled_from(BAD_SUFFIXES),
    )
    | st.sampled_from(["x", "..", "1e3s", "1 x", "%", "ms5", "5m-1s", "1h 2"])
)


@FAST
@given(duration=valid_durations)
def test_valid_durations_parse_to_their_seconds(duration: tuple[Any, float]) -> None:
    value, seconds = duration
    parsed = parse_duration(value, name="SOME_KEY")
    assert abs(parsed.total_seconds() - seconds) <= 1e-6 * max(1.0, seconds)


@FAST
@given(value=invalid_durations)
def test_invalid_durations_raise_naming_the_setting_and_the_value(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^SOME_KEY: ") as raised:
        parse_duration(value, name="SOME_KEY")
    message = str(raised.value)
    assert repr(value) in message, message


@FAST
@given(duration=st.timedeltas(min_value=datetime.timedelta(0)))
@example(duration=datetime.timedelta.max)
@example(duration=datetime.timedelta(days=400 * 365, microseconds=1))
def test_formatted_durations_read_back_as_the_same_duration(duration: datetime.timedelta) -> None:
    assert parse_duration(format_duration(duration), name="SOME_KEY") == duration


POSITIVE_DURATIONS = ["HEARTBEAT_INTERVAL", "STALE_AFTER", "POLL_INTERVAL", "LEADER_LEASE"]
SERVICE_INTERVALS = ["RESCUE_INTERVAL", "SCHEDULER_INTERVAL", "CLEANER_INTERVAL"]


def expected_setting(key: str, value: Any) -> Any:
    """What eddyq_settings should read for ``value``; raises ValueError if it is invalid."""
    if key == "MAX_ATTEMPTS":
        if type(value) is not int or value < 1:
            raise ValueError
        return value
    if key == "LISTEN_NOTIFY":
        if type(value) is not bool:
            raise ValueError
        return value
    if key == "DEFAULT_QUEUE":
        if not isinstance(value, str) or not QUEUE_NAME.fullmatch(value):
            raise ValueError
        return value
    if key in SERVICE_INTERVALS and value is None:
        return None
    duration = parse_duration(value, name=key)
    if key in SERVICE_INTERVALS:
        return duration or None
    if not duration:
        raise ValueError
    return duration


setting_values = (
    st.sampled_from([None, True, False, "", "soon", "-1s", 0, 1, 25, "0s"])
    | st.integers(-5, 10**6)
    | valid_durations.map(lambda pair: pair[0])
    | invalid_durations
    | st.text(max_size=8)
)


@FAST
@given(
    key=st.sampled_from(
        [*POSITIVE_DURATIONS, *SERVICE_INTERVALS, "MAX_ATTEMPTS", "LISTEN_NOTIFY", "DEFAULT_QUEUE"]
    ),
    value=setting_values,
)
def test_settings_read_valid_values_and_name_invalid_ones(key: str, value: Any) -> None:
    try:
        expected = expected_setting(key, value)
    except ValueError:
        expected = ValueError
    with override_settings(EDDYQ={key: value}):
        if expected is ValueError:
            with pytest.raises(InvalidSettingError) as raised:
                getattr(eddyq_settings, key)
            message = str(raised.value)
            assert f'EDDYQ["{key}"]' in message and repr(value) in message, message
            assert [problem.key for problem in eddyq_settings.problems()] == [key]
        else:
            assert getattr(eddyq_settings, key) == expected
            assert eddyq_settings.problems() == []
    # Nothing of it stays behind once the override ends.
    assert getattr(eddyq_settings, key) == expected_setting(key, DEFAULTS[key])


@contextlib.contextmanager
def environment_variable(name: str, text: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = text
    eddyq_settings.reload()
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
        eddyq_settings.reload()


@FAST
@given(
    key=st.sampled_from([*POSITIVE_DURATIONS, "RESCUE_INTERVAL"]),
    text=texts.filter(lambda text: "$" not in text)
    | valid_durations.map(lambda pair: str(pair[0])),
)
def test_duration_environment_variables_read_or_name_the_variable(key: str, text: str) -> None:
    variable = f"EDDYQ_{key}"
    try:
        expected = expected_setting(
            key,
            None
            if key == "RESCUE_INTERVAL" and text.strip().lower() in ("none", "null", "forever")
            else text,
        )
    except ValueError:
        expected = ValueError
    with environment_variable(variable, text):
        if expected is ValueError:
            with pytest.raises(InvalidSettingError) as raised:
                getattr(eddyq_settings, key)
            message = str(raised.value)
            assert f"environment variable {variable}" in message and repr(text) in message
        else:
            assert getattr(eddyq_settings, key) == expected


# Rows edited by hand.

MALFORMED_ARGS = st.one_of(
    st.dictionaries(texts, plain_json_leaves, min_size=1, max_size=3),
    texts.filter(bool),
    st.integers(),
    st.booleans(),
    st.none(),
)
MALFORMED_KWARGS = st.one_of(
    st.lists(plain_json_leaves, max_size=3),
    texts,
    st.integers(),
    st.booleans(),
    st.none(),
)


def unknown_task_paths() -> st.SearchStrategy[str]:
    return st.one_of(
        texts.filter(lambda path: "." not in path),
        texts.filter(lambda name: "." not in name and not hasattr(jobs, name)).map(
            lambda name: f"tests.jobs.{name}"
        ),
        st.from_regex(r"\A[a-z_][a-z0-9_]{0,8}\Z").map(lambda name: f"no_such_module_{name}.run"),
        st.sampled_from(["tests.jobs.", ".", "..", "tests..jobs.add", "tests.jobs.os"]),
    )


@st.composite
def hand_edited_rows(draw: st.DrawFn) -> tuple[str, Any, Any, str]:
    """(task, args, kwargs, a word the job's error must contain)."""
    kind = draw(st.sampled_from(["task", "args", "kwargs"]))
    if kind == "task":
        path = draw(unknown_task_paths())
        return path, [], {}, repr(path)
    if kind == "args":
        return "tests.jobs.echo", draw(MALFORMED_ARGS), {}, "args"
    return "tests.jobs.echo", [], draw(MALFORMED_KWARGS), "kwargs"


INSERT_BY_HAND = """
INSERT INTO eddyq_jobs (task, args, kwargs, queue, priority, state, attempt, max_attempts, errors,
                        metadata)
VALUES (%s, %s::jsonb, %s::jsonb, 'default', 0, 'available', 0, 1, '[]', '{}')
RETURNING id
"""


def insert_by_hand(task: str, args: Any, kwargs: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute(INSERT_BY_HAND, [task, json.dumps(args), json.dumps(kwargs)])
        return int(cursor.fetchone()[0])


def check_failed_clearly(job_id: int, says: str) -> None:
    job = Job.all_objects.get(pk=job_id)
    assert job.state == "failed", (
        f"{job.task} {job.args!r} {job.kwargs!r}: {job.state}, {job.result!r}"
    )
    [entry] = job.errors
    assert says in entry["error"], entry["error"]


@pytest.mark.django_db(transaction=True)
@settings(FAST, max_examples=25)
@given(rows=st.lists(hand_edited_rows(), min_size=1, max_size=6))
def test_rows_edited_by_hand_fail_clearly_and_the_worker_carries_on(
    rows: list[tuple[str, Any, Any, str]], run_burst_worker: Callable[..., Worker]
) -> None:
    inserted = [(insert_by_hand(task, args, kwargs), says) for task, args, kwargs, says in rows]
    good = jobs.add.enqueue(2, 3)
    # Without a listener thread, which would outlive the worker into the next example.
    with override_settings(EDDYQ={**FAST_SETTINGS, "LISTEN_NOTIFY": False}):
        run_burst_worker()  # returns: the worker neither crashed nor stopped early
    assert Job.all_objects.get(pk=good.pk).result == 5
    for job_id, says in inserted:
        check_failed_clearly(job_id, says)


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_a_worker_process_survives_rows_edited_by_hand(fleet: Fleet) -> None:
    worker = fleet.start("--concurrency", "2")
    worker.worker_id()
    rows = {
        insert_by_hand("tests.jobs.nope", [], {}): "'tests.jobs.nope'",
        insert_by_hand("no_such_module.run", [1], {}): "'no_such_module.run'",
        insert_by_hand("tests.jobs.os", [], {}): "'tests.jobs.os'",
        insert_by_hand("tests.jobs.echo", None, {}): "args",
        insert_by_hand("tests.jobs.echo", [], [1, 2]): "kwargs",
        insert_by_hand("tests.jobs.echo", [], "text"): "kwargs",
        insert_by_hand("tests.jobs.echo", {"user_id": 1}, {}): "args",
        insert_by_hand("tests.jobs.echo", "abc", {}): "args",
    }
    good = jobs.add.enqueue(2, 3)
    wait_until(
        lambda: not Job.all_objects.filter(state__in=["available", "running"]).exists(),
        15,
        "every row to be tried",
    )
    assert worker.alive()
    assert Job.all_objects.get(pk=good.pk).result == 5
    failures = []
    for job_id, says in rows.items():
        try:
            check_failed_clearly(job_id, says)
        except AssertionError as error:
            failures.append(str(error).splitlines()[0])
    assert failures == []
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
