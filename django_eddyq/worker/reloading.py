"""``--reload``, for development: a worker that restarts when its code changes.

As ``runserver`` does, the command runs twice: a parent that only restarts its child, and the
child (Django's ``RUN_MAIN`` set), whose files Django's autoreloader watches. Unlike
``runserver``'s, the child stops gracefully when a file changes (its running jobs get the
shutdown timeout to end, as at a stop signal), and then exits for its parent to start it again;
a stop signal reaches the child through its parent, once.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from django.utils import autoreload

logger = logging.getLogger(__name__)

# The status by which a child asks to be started again: Django's reloader's own.
RESTART_EXIT_CODE = 3


def in_child() -> bool:
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


def run_parent() -> int:
    """Start the command again as a child, and again each time it asks to be; forward stop
    signals to it. Returns the status of the last child."""
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for which in (signal.SIGINT, signal.SIGTERM):
        signal.signal(which, forward)
    environment = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    while True:
        # Its own process group: a Ctrl-C in the terminal reaches only this process, which
        # passes it on, so that the child sees each stop signal once.
        child = subprocess.Popen(autoreload.get_child_arguments(), env=environment, process_group=0)
        code = child.wait()
        if code != RESTART_EXIT_CODE:
            return code
        if stopping:  # a file changed as it stopped
            return 0


def run_restarting_on_change(run: Callable[[], object], on_change: Callable[[Path], None]) -> None:
    """In the child: ``run()`` while Django's autoreloader watches the code; when a file
    changes, ``on_change(path)`` (which must make ``run`` return) and exit to be started
    again."""
    changed: list[Path] = []
    restarting = threading.Event()

    def note(sender: object, file_path: Path, **kwargs: Any) -> None:
        # Returns None: the change is not handled here, so it restarts the child unless
        # another receiver handles it (a template's, a translation's).
        changed.append(file_path)

    def watch() -> None:
        autoreload.file_changed.connect(note, weak=False)
        try:
            autoreload.get_reloader().run(threading.main_thread())
        except SystemExit:
            # The reloader ends its thread so when a change was not handled.
            restarting.set()
            on_change(changed[-1])
        except Exception:
            logger.exception("eddyq worker: the autoreloader failed; code changes are ignored")

    threading.Thread(target=watch, name="eddyq-reloader", daemon=True).start()
    run()
    if restarting.is_set():
        sys.exit(RESTART_EXIT_CODE)
