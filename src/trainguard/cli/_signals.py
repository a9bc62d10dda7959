"""Ctrl-C and SIGTERM for every command.

The first SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop, `kill PID`) raises
`errors.Interrupted` in the main thread: the command stops as after Ctrl-C, with its cleanup (a
run closes its log and writes its report; its hang watchdog removes its unused backstop file),
and exits 130 for SIGINT or 143 for SIGTERM (`errors.py`'s table).

A second signal during that cleanup ends the process at once with the same status, and an
interrupted command skips the interpreter's own shutdown (a second or more with torch loaded):
a signal landing there would kill the process by signal, with no exit status, or break an atexit
hook with a traceback or a "Fatal Python error". Every file trainguard writes is written
atomically, so ending at once loses nothing that was complete.

Inside a torchrun worker SIGTERM keeps its default action: the elastic agent sends it to tear a
job down, and it must end even a rank stuck in a collective (after the distributed guards
(`guard/distributed/guards.py`) have dumped its stacks).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from trainguard.errors import Interrupted, signal_status

_first: int | None = None  # the signal that interrupted this process
_owner = os.getpid()


def _handler(signum: int, frame: FrameType | None) -> None:
    global _first
    if os.getpid() != _owner:  # a forked child inherited the handler: the default is its own
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _first is not None:  # a second signal during the cleanup: leave now
        _leave(signal_status(_first), f"\n{signal.Signals(signum).name} again: exiting now\n")
    _first = signum
    raise Interrupted(signum)


def _leave(status: int, message: str = "") -> None:
    with contextlib.suppress(Exception):
        if message:
            sys.stderr.write(message)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


@contextlib.contextmanager
def graceful_interrupts() -> Iterator[None]:
    """Around the whole command line (`cli.main`)."""
    from trainguard.train.launch import under_launcher

    signal.signal(signal.SIGINT, _handler)
    if not under_launcher():
        signal.signal(signal.SIGTERM, _handler)
    try:
        yield
    except SystemExit as e:
        if _first is not None:
            _leave(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)
        raise
    except KeyboardInterrupt:
        if _first is not None:
            _leave(signal_status(_first))
        raise
