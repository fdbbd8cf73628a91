"""How a running handler learns that its job was cancelled."""

from __future__ import annotations

import contextvars
import dataclasses


@dataclasses.dataclass(slots=True)
class CancelFlag:
    """Raised by the worker when the running job's cancellation is requested."""

    requested: bool = False


current_flag: contextvars.ContextVar[CancelFlag | None] = contextvars.ContextVar(
    "eddyq_cancel_flag", default=None
)


def cancel_requested() -> bool:
    """True once the job this handler runs for has been cancelled.

    A long sync handler checks it between steps and raises to stop: it then ends
    ``cancelled``, never retried. (An async handler is cancelled for it.) Outside a job: False.
    """
    flag = current_flag.get()
    return flag is not None and flag.requested
