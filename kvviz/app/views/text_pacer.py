"""Texts shown at a reading pace: at most so many times a second while a run plays, the last state always."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer


class TextPacer:
    """Calls `show` on `run` once texts are `request`ed, at most `per_second` times a second (nobody reads
    faster), and for the last request always, by a timer; after `show_next_at_once` the next run shows at once."""

    def __init__(self, show: Callable[[], None], per_second: float, parent: QObject) -> None:
        self._show = show
        self._interval_ms = 1000 / per_second
        self._pending = False
        self._shown_at = 0.0
        self._timer = QTimer(parent)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.run)

    def request(self) -> None:
        self._pending = True

    def show_next_at_once(self) -> None:
        self._shown_at = 0.0

    def run(self) -> None:
        if not self._pending:
            return
        wait_ms = self._interval_ms - (time.perf_counter() - self._shown_at) * 1000
        if wait_ms > 0:
            if not self._timer.isActive():
                self._timer.start(int(wait_ms) + 1)
            return
        self._pending = False
        self._shown_at = time.perf_counter()
        self._show()
