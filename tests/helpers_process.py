"""Processes the tests start, as a person starts them from a terminal."""

from __future__ import annotations

import signal


def ctrl_c_as_on_a_terminal() -> None:
    """A `preexec_fn`: Ctrl+C (SIGINT) reaches the child as it does from a terminal. A shell's background job (tests
    started with `&`) ignores SIGINT, and a child inherits that: kvviz then rightly leaves Ctrl+C alone, and a test
    of what Ctrl+C does would wait on a run that never ends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
