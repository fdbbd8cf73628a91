"""The settings of django_eddyq, read as ``eddyq_settings.STALE_AFTER`` and so on.

Each value comes from, in order of precedence: its ``EDDYQ_<KEY>`` environment variable, the
``EDDYQ`` dict of the Django settings, the default. Nothing is read at import time; a value is
read, checked and cached when first used, and forgotten when ``EDDYQ`` changes (as under
``override_settings``) or on ``eddyq_settings.reload()``. An invalid value raises
``InvalidSettingError`` naming the key, the value and where it came from; ``problems()`` lists
them all without raising, for the system checks.
"""

import datetime
import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Self, overload

import environ
from croniter import croniter
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_eddyq.durations import parse_duration
from django_eddyq.limits import Limits
from django_eddyq.vocabulary import QUEUE_NAME_RULE, TERMINAL_STATES, is_positive_int, is_queue_name

ENV_PREFIX = "EDDYQ_"
RETENTION_STATES = (*TERMINAL_STATES, "batch")

# Words that stand for None in environment variables, where the setting allows None.
_NONE_WORDS = frozenset({"none", "null", "forever"})
_TRUE_WORDS = frozenset(environ.Env.BOOLEAN_TRUE_STRINGS)
# environ reads every word it does not know as False; a typo must not silently switch a feature off.
_FALSE_WORDS = frozenset({"false", "off", "no", "n", "0"})
_environment = environ.Env()

type Validator[T] = Callable[[object, str], T]
"""Checks and converts a value; the string names its source in the ``ValueError`` it raises."""
type EnvironmentDecoder = Callable[[str, str], object]
"""Turns an environment variable's text into a value for the validator."""


@dataclass(frozen=True)
class SettingProblem:
    """An invalid setting: ``key`` of ``EDDYQ`` (or ``"EDDYQ"`` itself), its source and value."""

    key: str
    source: str
    value: object
    message: str


class InvalidSettingError(ImproperlyConfigured):
    """Raised on using an invalid setting; ``problem`` says which and why."""

    def __init__(self, problem: SettingProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _setting_label(key: str) -> str:
    return f'EDDYQ["{key}"]'


def _environment_label(variable: str) -> str:
    return f"environment variable {variable}"


def did_you_mean(name: str, known: tuple[str, ...]) -> str:
    """A hint naming the closest of ``known`` to the misspelled ``name``, or listing them all."""
    by_folded_case = {candidate.casefold(): candidate for candidate in known}
    close = difflib.get_close_matches(name.casefold(), by_folded_case, n=1)
    if close:
        return f"Did you mean {by_folded_case[close[0]]!r}?"
    return "Known: " + ", ".join(known) + "."


# Validators.


def _database_alias(value: object, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{source}: {value!r} is not a database alias (a key of DATABASES)")
    return value


def _queue_name(value: object, source: str) -> str:
    if is_queue_name(value):
        return value
    raise ValueError(f"{source}: {value!r} is not a queue name ({QUEUE_NAME_RULE})")


def _positive_int(value: object, source: str) -> int:
    if is_positive_int(value):
        return value
    raise ValueError(f"{source}: {value!r} is not a whole number of 1 or more")


def _bool(value: object, source: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {value!r} is not True or False")
    return value


def _duration(value: object, source: str) -> datetime.timedelta:
    return parse_duration(value, name=source)


def _positive_duration(value: object, source: str) -> datetime.timedelta:
    duration = parse_duration(value, name=source)
    if not duration:
        raise ValueError(f"{source}: {value!r} is zero; it must be longer")
    return duration


def _service_interval(value: object, source: str) -> datetime.timedelta | None:
    """How often a service runs; None or zero turns it off."""
    if value is None:
        return None
    return parse_duration(value, name=source) or None


def _retention_period(value: object, source: str) -> datetime.timedelta | None:
    """How long finished rows are kept: None keeps them forever, zero deletes them at once."""
    if value is None:
        return None
    return parse_duration(value, name=source)


def _retention(value: object, source: str) -> dict[str, datetime.timedelta | None]:
    """The states given in a RETENTION dict; the caller merges them over the defaults."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: {value!r} is not a dict of {', '.join(RETENTION_STATES)}")
    for state in value:
        if state not in RETENTION_STATES:
            hint = did_you_mean(str(state), RETENTION_STATES)
            raise ValueError(f"{source}: {state!r} is not a job state with a retention. {hint}")
    return {
        state: _retention_period(period, f'{source}["{state}"]') for state, period in value.items()
    }


def _cron_expression_or_none(value: object, source: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not croniter.is_valid(value):
        raise ValueError(
            f"{source}: {value!r} is not a cron expression (like '0 0 * * *'; None disables)"
        )
    return value


def _index_names(value: object, source: str) -> tuple[str, ...]:
    # A lone string is refused: it would otherwise be read letter by letter.
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"{source}: {value!r} is not a list of index names")
    for name in value:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{source}: {name!r} in {value!r} is not an index name")
    return tuple(value)


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _module_names(value: object, source: str) -> tuple[str, ...]:
    # A lone string is refused: it would otherwise be read letter by letter.
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"{source}: {value!r} is not a list of module names")
    for name in value:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise ValueError(f"{source}: {name!r} in {value!r} is not a dotted module name")
    return tuple(value)


def _dotted_path_or_none(value: object, source: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or "." not in value or not _MODULE_NAME.fullmatch(value):
        raise ValueError(f"{source}: {value!r} is not a dotted path (like 'myapp.codecs.codec')")
    return value


def _queues(value: object, source: str) -> dict[str, Limits]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: {value!r} is not a dict of queue names to dicts of limits")
    limits = {}
    for name, options in value.items():
        if not is_queue_name(name):
            raise ValueError(f"{source}: {name!r} is not a queue name ({QUEUE_NAME_RULE})")
        if not isinstance(options, Mapping):
            raise ValueError(f"{source}[{name!r}]: {options!r} is not a dict of limits")
        try:
            limits[name] = Limits.from_options(options)
        except ValueError as error:
            raise ValueError(f"{source}[{name!r}]: {error}") from None
    return limits


def _periodic(value: object, source: str) -> dict[str, dict[str, object]]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: {value!r} is not a dict of names to dicts of options")
    for name, options in value.items():
        if not isinstance(name, str) or not isinstance(options, Mapping):
            raise ValueError(f"{source}: entry {name!r} is not a name with a dict of options")
    return {name: dict(options) for name, options in value.items()}


# Decoders of environment variables' text.


def _text(text: str, source: str) -> object:
    return text


def _text_or_none(text: str, source: str) -> object:
    return None if text.strip().lower() in _NONE_WORDS else text


def _int_text(text: str, source: str) -> object:
    # Text that is not a number goes on to the validator, which says what it expected.
    try:
        return int(text)
    except ValueError:
        return text


def _bool_text(text: str, source: str) -> object:
    word = text.strip().lower()
    if word not in _TRUE_WORDS | _FALSE_WORDS:
        raise ValueError(f"{source}: {text!r} is not a boolean (true/false, yes/no, on/off, 1/0)")
    return environ.Env.parse_value(word, bool)


def _comma_separated(text: str, source: str) -> object:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _read_environment(variable: str, source: str) -> str:
    try:
        text: str = _environment.str(variable)
    except ImproperlyConfigured as error:  # environ's "$OTHER" reference to an unset variable
        raise ValueError(f"{source}: {error}") from None
    return text


def _checked[T](key: str, source: str, value: object, validate: Validator[T]) -> T:
    try:
        return validate(value, source)
    except ValueError as error:
        raise InvalidSettingError(SettingProblem(key, source, value, str(error))) from None


def _from_environment[T](
    key: str, variable: str, decode: EnvironmentDecoder, validate: Validator[T]
) -> T:
    source = _environment_label(variable)
    try:
        return validate(decode(_read_environment(variable, source), source), source)
    except ValueError as error:
        text = _environment.ENVIRON[variable]
        raise InvalidSettingError(SettingProblem(key, source, text, str(error))) from None


def _configured() -> Mapping[str, object]:
    """``settings.EDDYQ``, which may be missing."""
    configured: object = getattr(settings, "EDDYQ", {})
    if not isinstance(configured, Mapping):
        message = f"settings.EDDYQ: {configured!r} is not a dict"
        raise InvalidSettingError(SettingProblem("EDDYQ", "settings.EDDYQ", configured, message))
    return configured


class Setting[T]:
    """One key of ``EDDYQ``: its default, its validator and how its environment variable reads.

    As an attribute of ``EddyqSettings`` it reads, checks and caches the value on first use.
    """

    key: str

    def __init__(
        self,
        default: object,
        validate: Validator[T],
        *,
        from_environment: EnvironmentDecoder | None = _text,
    ) -> None:
        self.default = default
        self.validate = validate
        self.from_environment = from_environment

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, instance: None, owner: type) -> Self: ...
    @overload
    def __get__(self, instance: "EddyqSettings", owner: type) -> T: ...
    def __get__(self, instance: "EddyqSettings | None", owner: type) -> Self | T:
        if instance is None:
            return self
        value = self.resolve(_configured())
        # Stored on the instance, it hides this (non-data) descriptor until reload() drops it.
        instance.__dict__[self.key] = value
        return value

    def environment_variables(self) -> tuple[str, ...]:
        return () if self.from_environment is None else (ENV_PREFIX + self.key,)

    def resolve(self, configured: Mapping[str, object]) -> T:
        """The current value, from the environment, ``configured`` or the default."""
        variable = ENV_PREFIX + self.key
        if self.from_environment is not None and variable in _environment.ENVIRON:
            return _from_environment(self.key, variable, self.from_environment, self.validate)
        if self.key in configured:
            return _checked(self.key, _setting_label(self.key), configured[self.key], self.validate)
        return _checked(self.key, "default", self.default, self.validate)


class RetentionSetting(Setting[dict[str, datetime.timedelta | None]]):
    """RETENTION: given states merge over the defaults; each state has its own variable."""

    def __init__(self, default: dict[str, str | None]) -> None:
        super().__init__(default, _retention, from_environment=None)

    def environment_variables(self) -> tuple[str, ...]:
        return tuple(f"{ENV_PREFIX}{self.key}_{state.upper()}" for state in RETENTION_STATES)

    def resolve(self, configured: Mapping[str, object]) -> dict[str, datetime.timedelta | None]:
        periods = _checked(self.key, "default", self.default, _retention)
        if self.key in configured:
            label = _setting_label(self.key)
            periods |= _checked(self.key, label, configured[self.key], _retention)
        for state, variable in zip(RETENTION_STATES, self.environment_variables(), strict=True):
            if variable in _environment.ENVIRON:
                periods[state] = _from_environment(
                    self.key, variable, _text_or_none, _retention_period
                )
        return periods


class EddyqSettings:
    """The settings; see docs/settings.md for what each one means."""

    DATABASE = Setting("default", _database_alias)
    DEFAULT_QUEUE = Setting("default", _queue_name)
    MAX_ATTEMPTS = Setting(25, _positive_int, from_environment=_int_text)
    HEARTBEAT_INTERVAL = Setting("15s", _positive_duration)
    STALE_AFTER = Setting("60s", _positive_duration)
    POLL_INTERVAL = Setting("1s", _positive_duration)
    LISTEN_NOTIFY = Setting(True, _bool, from_environment=_bool_text)
    RESCUE_INTERVAL = Setting("30s", _service_interval, from_environment=_text_or_none)
    RECOVER_STALE_ON_START = Setting(True, _bool, from_environment=_bool_text)
    SCHEDULER_INTERVAL = Setting("5s", _service_interval, from_environment=_text_or_none)
    CLEANER_INTERVAL = Setting("5m", _service_interval, from_environment=_text_or_none)
    RETENTION = RetentionSetting(
        {"completed": "24h", "failed": "7d", "cancelled": "7d", "batch": "7d"}
    )
    QUEUE_CLEANER_INTERVAL = Setting("1h", _service_interval, from_environment=_text_or_none)
    QUEUE_RETENTION = Setting("24h", _duration)
    WORKER_RETENTION = Setting("24h", _retention_period, from_environment=_text_or_none)
    ACTIVITY_SAMPLE_INTERVAL = Setting("1m", _service_interval, from_environment=_text_or_none)
    ACTIVITY_RETENTION = Setting("8d", _retention_period, from_environment=_text_or_none)
    REINDEX_SCHEDULE = Setting(
        "0 0 * * *", _cron_expression_or_none, from_environment=_text_or_none
    )
    REINDEX_INDEXES = Setting(
        (
            "eddyq_jobs_claim_idx",
            "eddyq_jobs_queue_claim_idx",
            "eddyq_jobs_due_idx",
            "eddyq_jobs_lease_idx",
        ),
        _index_names,
        from_environment=_comma_separated,
    )
    LEADER_LEASE = Setting("30s", _positive_duration)
    LEADER_RENEW_INTERVAL = Setting("10s", _positive_duration)
    PERIODIC = Setting({}, _periodic, from_environment=None)
    QUEUES = Setting({}, _queues, from_environment=None)
    TASK_MODULES = Setting((), _module_names, from_environment=_comma_separated)
    METRICS = Setting(False, _bool, from_environment=_bool_text)
    ARGUMENT_CODEC = Setting(None, _dotted_path_or_none, from_environment=_text_or_none)

    @property
    def defaults(self) -> Mapping[str, object]:
        return DEFAULTS

    def reload(self) -> None:
        """Forget the cached values; the next use reads settings and environment again."""
        for key in DEFAULTS:
            self.__dict__.pop(key, None)

    def problems(self) -> list[SettingProblem]:
        """Every invalid value, read afresh, one per key; nothing is raised or cached."""
        try:
            configured = _configured()
        except InvalidSettingError as error:
            return [error.problem]
        problems = []
        for setting in SETTINGS:
            try:
                setting.resolve(configured)
            except InvalidSettingError as error:
                problems.append(error.problem)
        return problems


SETTINGS: tuple[Setting[Any], ...] = tuple(
    attribute for attribute in vars(EddyqSettings).values() if isinstance(attribute, Setting)
)
DEFAULTS: Mapping[str, object] = MappingProxyType(
    {setting.key: setting.default for setting in SETTINGS}
)
ENVIRONMENT_VARIABLES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {setting.key: setting.environment_variables() for setting in SETTINGS}
)
"""The environment variables of each key (none for PERIODIC and QUEUES)."""

eddyq_settings = EddyqSettings()


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: object) -> None:
    if setting == "EDDYQ":
        eddyq_settings.reload()
