"""The examples in docs/*.md run, against the test database.

The convention for fenced code blocks in the docs:

* ```` ```python ```` (the info string is exactly ``python``): an example that runs. Each page's
  runnable blocks run in order, in one namespace, so a later block uses the names of an earlier
  one. A block that raises fails this test, naming the page and the block's line.
* ```` ```python title="myapp/views.py" ```` (``python`` followed by anything): shown, never run.
  For settings, module layouts, code that needs a request or a project that is not here.
* Any other language (``text``, ``bash``, ``ini``, ``pycon``, ...): shown, never run.
* A fence without a language, or ``py`` / ``python3``, is an error: say what the block is.

A page's namespace is a real module, ``docs_<page>``, registered in ``sys.modules`` while the page
runs, so that a worker can import the tasks it defines by their path (``docs_quickstart.send``).
The database is really committed (``transaction=True``), because a worker only sees committed
jobs: run them with ``Worker(burst=True).run()``.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import traceback
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
RUNNABLE = "python"
AMBIGUOUS = frozenset({"", "py", "python3"})
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the first line of code, 1-based
    info: str
    code: str

    @property
    def language(self) -> str:
        return self.info.split(maxsplit=1)[0] if self.info else ""

    @property
    def runnable(self) -> bool:
        return self.info == RUNNABLE

    @property
    def where(self) -> str:
        return f"docs/{self.path.name}, line {self.line}"


def fenced_blocks(path: Path) -> Iterator[Block]:
    """Every fenced code block of a Markdown page, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        index += 1
        if opening is None:
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        start = index
        while index < len(lines):
            closing = FENCE.match(lines[index])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            index += 1
        else:
            raise AssertionError(f"docs/{path.name}, line {start}: the fence is never closed")
        body = [line[indent:] if line[:indent].isspace() else line for line in lines[start:index]]
        index += 1
        yield Block(path, start + 1, opening["info"].strip(), "\n".join(body) + "\n")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def pages_with_examples() -> list[Path]:
    return [page for page in pages() if any(block.runnable for block in fenced_blocks(page))]


def test_the_docs_have_runnable_examples() -> None:
    assert {page.name for page in pages_with_examples()} >= {"quickstart.md", "tasks.md"}


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.name)
def test_every_block_says_what_it_is(page: Path) -> None:
    unclear = [
        f"{block.where}: ```{block.info}"
        for block in fenced_blocks(page)
        if block.language in AMBIGUOUS
    ]
    assert not unclear, (
        'Fenced blocks need a clear language: ```python runs, ```python title="..." is only '
        "shown, any other language (text, bash, ...) is only shown.\n" + "\n".join(unclear)
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", pages_with_examples(), ids=lambda page: page.name)
def test_examples_run(page: Path) -> None:
    name = f"docs_{page.stem.replace('-', '_')}"
    module = types.ModuleType(name, f"The runnable examples of docs/{page.name}.")
    module.__file__ = str(page)
    assert name not in sys.modules
    sys.modules[name] = module
    try:
        for block in fenced_blocks(page):
            if block.runnable:
                run(block, module)
    finally:
        del sys.modules[name]


def run(block: Block, module: types.ModuleType) -> None:
    # Blank lines in front keep the line numbers of tracebacks those of the Markdown page.
    source = "\n" * (block.line - 1) + block.code
    try:
        exec(compile(source, str(block.path), "exec"), module.__dict__)
    except Exception:
        failure = traceback.format_exc()
    else:
        return
    pytest.fail(f"The example at {block.where} raised:\n\n{block.code}\n{failure}", pytrace=False)
