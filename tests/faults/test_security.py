"""Security: nothing unpickles, and no SQL is built from input.

A static review of ``django_eddyq/`` by its syntax trees rather than by grep, so that comments
and docstrings don't count and no call hides behind a line break:

* no ``pickle``, ``marshal``, ``shelve``, ``dill``, ``cloudpickle`` or ``jsonpickle``, no
  ``eval``/``exec``/``__import__``, no ``yaml.load``;
* every statement handed to the database (the first argument of ``execute``, ``executemany``,
  ``raw``, ``extra``, ``RawSQL`` and ``RunSQL``, and the SQL an ``as_sql`` returns) must be
  constant text: a literal, a constant of ``django_eddyq/sql.py`` (itself built only from
  literals and other constants), such text formatted with constants or chosen between
  constants, ``psycopg.sql`` composed with ``Identifier`` (and rendered by ``as_string``),
  numbers forced through ``int()``, or a parameter that every caller passes constant text.
  Values travel as query parameters. What the rules can't prove is listed in ``REVIEWED`` with
  why it is safe; a new one fails here until someone has reviewed it.

Then the identifiers that do reach SQL are checked at run time: queue names are validated, and
an index name from the settings is looked up as a value and quoted as an identifier.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from demo.models import Execution
from django_eddyq.maintenance import Reindexer
from django_eddyq.models import Job
from django_eddyq.vocabulary import validate_queue_name

PACKAGE = Path(__file__).resolve().parents[2] / "django_eddyq"
SQL_MODULE = PACKAGE / "sql.py"

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
UNSAFE_MODULES |= {"jsonpickle"}
UNSAFE_CALLS = {"eval", "exec", "__import__"}
SQL_METHODS = {"execute", "executemany", "raw", "extra"}
SQL_CALLS = {"RawSQL", "RunSQL"}
NUMBER_MAKERS = {"int", "float", "round", "len"}

# Statements the rules can't prove constant, reviewed by hand: (file, function) -> why safe.
REVIEWED = {
    ("maintenance/cleaner.py", "delete_expired"): (
        "sql.delete_expired_statement(): the table is a psycopg.sql.Identifier of a literal name "
        "(test_the_cleaner_is_only_given_literal_table_names), and the condition is "
        "sql.BATCH_EXPIRED or sql.JOB_EXPIRED_* formatted with column names and the fixed "
        "terminal states (retention.job_expiries); times and periods are %s parameters"
    ),
    ("maintenance/reindexer.py", "_run"): (
        "each statement comes from Reindexer.plan(): psycopg.sql.SQL(sql.REINDEX_INDEX or "
        "sql.DROP_LEFTOVER_INDEX).format(index=psycopg.sql.Identifier(schema, name)), with the "
        "names read back from pg_catalog"
    ),
    ("inspection.py", "_state_counts"): (
        "inspection.state_counts_query(): sql.state_counts_statement() with each terminal "
        "state's retention.job_expiries() conditions (the cleaner's, with now()) ORed; limits "
        "and periods are %s parameters"
    ),
    ("db.py", "send"): (
        "NumberedStatement.text: a statement of sql.py, built by its functions from constant "
        "fragments (the keyed claim's: worker/passes.py _keyed_statements), with its %(name)s "
        "numbered by db.numbered_parameters; values are parameters"
    ),
    ("managers.py", "as_sql"): (
        "managers.expired_job_condition(): sql.JOB_EXPIRED_* formatted with column references "
        "Django compiled (quoted identifiers) and the fixed terminal states; the retention "
        "periods are %s parameters"
    ),
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else path.name


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def root_name(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def test_nothing_unpickles_or_evaluates() -> None:
    found = []
    for path in modules():
        module = relative(path)
        for node in ast.walk(parsed(path)):
            where = f"{module}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            elif isinstance(node, ast.Name):
                names = {node.id}
            else:
                names = set()
            if names & UNSAFE_MODULES:
                found.append(f"{where}: {sorted(names & UNSAFE_MODULES)}")
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in UNSAFE_CALLS:
                    found.append(f"{where}: {func.id}()")
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr in {"load", "loads"}
                    and root_name(func) in UNSAFE_MODULES | {"yaml"}
                ):
                    found.append(f"{where}: {root_name(func)}.{func.attr}()")
    assert found == []


# The classifier of SQL text.

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Scope:
    """Where an expression appears: its module and the function around it."""

    module: Path
    function: Function | None

    @property
    def constants(self) -> dict[str, ast.expr]:
        return module_constants(self.module)

    def assignments(self, name: str) -> list[ast.expr]:
        """The values assigned to the local ``name`` anywhere in the function."""
        if self.function is None:
            return []
        values: list[ast.expr] = []
        for node in ast.walk(self.function):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        values.append(node.value)
                    elif isinstance(target, ast.Tuple):
                        values.extend(unpacked(target, node.value, name))
            elif (
                isinstance(node, ast.AnnAssign | ast.AugAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == name
                and node.value is not None
            ):
                values.append(node.value)
            elif isinstance(node, ast.For | ast.comprehension) and name in {
                n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)
            }:
                values.append(ast.Name(id="<loop variable>"))
        return values

    def parameters(self) -> list[str]:
        if self.function is None:
            return []
        arguments = self.function.args
        return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]


def unpacked(target: ast.Tuple, value: ast.expr, name: str) -> list[ast.expr]:
    """What ``name`` gets from ``a, b = value``; an unknown stand-in if it can't be told."""
    for index, element in enumerate(target.elts):
        if isinstance(element, ast.Name) and element.id == name:
            if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                return [value.elts[index]]
            if isinstance(value, ast.IfExp):
                return [*unpacked(target, value.body, name), *unpacked(target, value.orelse, name)]
            return [ast.Name(id="<unpacked>")]
    return []


@functools.cache
def module_constants(path: Path) -> dict[str, ast.expr]:
    """Module-level names in capitals (``NOW``, ``_CLAIM``) and what they are assigned."""
    constants = {}
    for node in parsed(path).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id.lstrip("_").isupper():
                    constants[target.id] = node.value
    return constants


@functools.cache
def module_functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in parsed(path).body if isinstance(node, ast.FunctionDef)}


def is_constant_text(node: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """True if ``node`` can only be text fixed in the source (or psycopg SQL composed with
    identifiers), whatever the input."""
    if depth > 12:
        return False

    def constant(child: ast.expr, where: Scope = scope) -> bool:
        return is_constant_text(child, where, depth + 1)

    def fragment(child: ast.expr) -> bool:
        return constant(child) or is_composed_identifier(child) or is_number(child, scope)

    match node:
        case ast.Constant(value=str() | None):
            return True
        case ast.Attribute(value=ast.Name(id="sql"), attr=attr):
            value = module_constants(SQL_MODULE).get(attr)
            return value is not None and constant(value, Scope(SQL_MODULE, None))
        case ast.Name(id=name):
            if name in scope.constants:
                return constant(scope.constants[name], Scope(scope.module, None))
            if name in scope.parameters():
                return every_caller_passes_constant_text(scope, name, depth)
            values = scope.assignments(name)
            return bool(values) and all(map(constant, values))
        case ast.JoinedStr(values=parts):
            return all(
                fragment(part.value) for part in parts if isinstance(part, ast.FormattedValue)
            )
        case ast.BinOp(op=ast.Add(), left=left, right=right):
            return constant(left) and constant(right)
        case ast.IfExp(body=body, orelse=orelse):
            return constant(body) and constant(orelse)
        case ast.Call(func=ast.Attribute(attr="format", value=template), args=args, keywords=kws):
            return constant(template) and all(map(fragment, [*args, *(k.value for k in kws)]))
        case ast.Call(func=ast.Attribute(attr="SQL"), args=[text]):  # psycopg.sql.SQL(text)
            return constant(text)
        case ast.Call(func=ast.Attribute(attr="as_string", value=composed)):  # psycopg.sql, as text
            return constant(composed)
        case ast.Subscript(value=table):  # a constant table of statements: sql.X[key]
            return constant(table)
        case ast.Dict(values=values):
            return all(constant(value) for value in values)
        case ast.DictComp(value=value):
            return constant(value)
        case ast.Call(func=ast.Name(id=name)) if name in module_functions(scope.module):
            return returns_constant_text(scope.module, name, depth)
        case ast.Call(func=ast.Attribute(value=ast.Name(id="sql"), attr=name)):
            return returns_constant_text(SQL_MODULE, name, depth)
    return False


def is_composed_identifier(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"Identifier", "Literal", "Placeholder"}
    )


def is_number(node: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """True if ``node`` is a number whatever the input: ``int(...)``, ``max`` of such..."""
    if depth > 6:
        return False
    match node:
        case ast.Constant(value=int() | float()):
            return True
        case ast.Call(func=ast.Name(id=name)) if name in NUMBER_MAKERS:
            return True
        case ast.Call(func=ast.Name(id="max" | "min"), args=args):
            return all(is_number(arg, scope, depth + 1) for arg in args)
        case ast.Name(id=name):
            values = scope.assignments(name)
            return bool(values) and all(is_number(v, scope, depth + 1) for v in values)
    return False


def returns_constant_text(path: Path, name: str, depth: int) -> bool:
    """True if the module-level function ``name`` of ``path`` returns constant text whatever it
    is given (its parameters may choose between constants, not be spliced in)."""
    function = module_functions(path).get(name)
    if function is None:
        return False
    scope = Scope(path, function)
    returns = [node.value for node in ast.walk(function) if isinstance(node, ast.Return)]
    return bool(returns) and all(
        value is not None and is_constant_text(value, scope, depth + 1) for value in returns
    )


def every_caller_passes_constant_text(scope: Scope, name: str, depth: int) -> bool:
    """True if every call of the function around ``scope`` passes constant text as ``name``."""
    function = scope.function
    assert function is not None
    positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    calls = [(call, where) for call, where in all_calls() if called_name(call) == function.name]
    if not calls:
        return False
    for call, where in calls:
        is_method = positional[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute)
        given = [keyword.value for keyword in call.keywords if keyword.arg == name]
        if not given and name in positional:
            index = positional.index(name) - is_method
            given = call.args[index : index + 1]
        if not given or not is_constant_text(given[0], where, depth + 1):
            return False
    return True


def called_name(call: ast.Call) -> str:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return call.func.id if isinstance(call.func, ast.Name) else ""


def enclosing(tree: ast.Module, node: ast.AST) -> Function | None:
    line = getattr(node, "lineno", 0)
    inside = [f for f in functions_in(tree) if f.lineno <= line <= (f.end_lineno or f.lineno)]
    return max(inside, key=lambda f: f.lineno) if inside else None


@functools.cache
def functions_in(tree: ast.Module) -> list[Function]:
    """The module's functions, methods and nested functions: walked once, not once per call."""
    return [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]


@functools.cache
def all_calls() -> list[tuple[ast.Call, Scope]]:
    """Every call in the package, with its scope."""
    return [
        (node, Scope(path, enclosing(parsed(path), node)))
        for path in modules()
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.Call)
    ]


@dataclass
class Site:
    """An expression handed to the database as SQL."""

    file: str
    line: int
    function: str
    code: str
    statement: ast.expr
    scope: Scope

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}(): {self.code}"


def is_sql_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in SQL_METHODS | SQL_CALLS
    return isinstance(func, ast.Name) and func.id in SQL_CALLS


def sql_sites(paths: list[Path]) -> list[Site]:
    """Every expression of ``paths`` handed to the database as SQL."""
    sites = []
    for path in paths:
        tree = parsed(path)
        source = path.read_text()
        handed: list[tuple[ast.AST, ast.expr]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and is_sql_call(node):
                handed.append((node, node.args[0]))
            if isinstance(node, ast.FunctionDef) and node.name == "as_sql":
                handed.extend(
                    (inner, inner.value.elts[0])
                    for inner in ast.walk(node)
                    if isinstance(inner, ast.Return) and isinstance(inner.value, ast.Tuple)
                )
        for node, statement in sorted(handed, key=lambda pair: getattr(pair[0], "lineno", 0)):
            function = enclosing(tree, node)
            sites.append(
                Site(
                    relative(path),
                    getattr(node, "lineno", 0),
                    function.name if function else "<module>",
                    ast.get_source_segment(source, statement) or "",
                    statement,
                    Scope(path, function),
                )
            )
    return sites


def test_every_constant_of_sql_py_is_constant_text() -> None:
    scope = Scope(SQL_MODULE, None)
    constants = module_constants(SQL_MODULE)
    assert len(constants) > 20
    assert [name for name, value in constants.items() if not is_constant_text(value, scope)] == []


def test_every_statement_is_constant_text_or_reviewed() -> None:
    sites = sql_sites(modules())
    assert len(sites) >= 20, "too few call sites: is the scan looking at the right code?"
    unreviewed = [
        str(site)
        for site in sites
        if not is_constant_text(site.statement, site.scope)
        and not is_composed_identifier(site.statement)
        and (site.file, site.function) not in REVIEWED
    ]
    assert unreviewed == [], (
        "SQL built from something not provably constant: make it constant text, psycopg.sql "
        "composition or a parameter, or review it and add it to REVIEWED:\n" + "\n".join(unreviewed)
    )
    # A stale entry could excuse a new construction in the same function: keep them current.
    assert set(REVIEWED) <= {(site.file, site.function) for site in sites}


UNSAFE_EXAMPLES = """
import psycopg

from django_eddyq import sql

def made_up_query_from_input(cursor, name, seconds):
    cursor.execute(f"SELECT * FROM {name}")
    cursor.execute("SELECT * FROM %s" % name)
    cursor.execute("SELECT * FROM {}".format(name))
    cursor.execute("SELECT * FROM " + name)
    cursor.execute(sql.REINDEX_INDEX.format(index=name))
    cursor.execute(psycopg.sql.SQL(name).as_string(cursor))
    statement = f"DROP TABLE {name}"
    cursor.execute(statement)
    for statement in name.split(";"):
        cursor.execute(statement)
    cursor.execute(f"SET LOCAL statement_timeout = {int(seconds * 1000)}")
    cursor.execute(sql.FINISH_JOBS if seconds else sql.DATABASE_NOW)
    listen = psycopg.sql.SQL(sql.LISTEN).format(channel=psycopg.sql.Identifier(name))
    cursor.execute(listen.as_string(cursor))
"""


def test_the_review_catches_sql_built_from_input(tmp_path: Path) -> None:
    """The rules are not vacuous: each way of splicing input into SQL is caught."""
    module = tmp_path / "made_up.py"
    module.write_text(UNSAFE_EXAMPLES)
    verdicts = [is_constant_text(site.statement, site.scope) for site in sql_sites([module])]
    assert verdicts == [False] * 8 + [True] * 3


def test_the_cleaner_is_only_given_literal_table_names() -> None:
    calls = [call for call, _scope in all_calls() if called_name(call) == "delete_expired"]
    assert calls
    for call in calls:
        assert isinstance(call.args[0], ast.Constant)
        assert call.args[0].value in {"eddyq_jobs", "eddyq_batches"}


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=80))
def test_queue_names_are_validated_before_they_reach_sql(name: str) -> None:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
    if 1 <= len(name) <= 64 and set(name) <= allowed:
        assert validate_queue_name(name) == name
    else:
        with pytest.raises(ValueError, match="queue name"):
            validate_queue_name(name)


HOSTILE_INDEX = 'eddyq"; DROP TABLE eddyq_jobs; --'


def create_hostile_index(sql_template: str) -> None:
    statement = psycopg.sql.SQL(sql_template).format(psycopg.sql.Identifier(HOSTILE_INDEX))
    with connection.cursor() as cursor:
        cursor.execute(statement.as_string(connection.connection))


@pytest.mark.django_db(transaction=True)
def test_an_index_name_from_the_settings_is_an_identifier_never_sql() -> None:
    """REINDEX_INDEXES comes from settings or the environment: a name that is SQL is looked
    up as a value (and not found), and an index really named so is quoted, not run."""
    reindexer = Reindexer()
    assert reindexer.plan(HOSTILE_INDEX) == []
    create_hostile_index("CREATE INDEX {} ON eddyq_jobs (priority)")
    try:
        [statement] = reindexer.plan(HOSTILE_INDEX)
        assert statement.endswith('."eddyq""; DROP TABLE eddyq_jobs; --"')
        with connection.cursor() as cursor:
            cursor.execute(statement)
            cursor.execute("SELECT to_regclass('eddyq_jobs') IS NOT NULL")
            assert cursor.fetchone()[0]
    finally:
        create_hostile_index("DROP INDEX IF EXISTS {}")


# Only registered tasks run: a writer to the jobs table cannot choose the code.

NOT_TASKS = {
    "os.system": ["touch {marker}"],
    "subprocess.run": [["touch", "{marker}"]],
    "builtins.eval": ["open({marker!r}, 'w').close()"],
    "builtins.exec": ["open({marker!r}, 'w').close()"],
    # Through the imports of a tasks module that discovery did import.
    "demo.tasks.os.system": ["touch {marker}"],
    # A plain function of an installed app.
    "django.contrib.auth.get_user_model": [],
    # A model's manager, through the tasks module that imports the model.
    "demo.tasks.Execution.objects.create": [],
    # A plain function beside the tests' tasks.
    "tests.jobs.plain_function": [21],
}


@pytest.mark.django_db(transaction=True)
def test_a_row_can_only_run_a_registered_task(
    run_burst_worker: Callable[..., Any], tmp_path: Path
) -> None:
    markers = {path: tmp_path / f"ran-{path}" for path in NOT_TASKS}
    rows = {
        path: Job.objects.create(
            task=path,
            args=json.loads(json.dumps(args).replace("{marker}", str(markers[path]))),
            kwargs={"label": "ran", "pid": 1} if path.endswith(".create") else {},
            max_attempts=1,
        )
        for path, args in NOT_TASKS.items()
    }
    run_burst_worker()
    for path, job in rows.items():
        stored = Job.objects.get(pk=job.pk)
        assert (stored.state, stored.result) == ("failed", None), path
        assert stored.errors[0]["error"] == (
            f"TaskNotFound: {path!r} is not a registered task: declare it with @task (or "
            "django.tasks' @task with eddyq's backend) in an installed app's tasks module or "
            'in a module of EDDYQ["TASK_MODULES"]'
        )
    assert [marker for marker in markers.values() if marker.exists()] == []
    assert not Execution.objects.exists()
