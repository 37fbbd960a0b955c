"""How many threads a one-token step takes: chosen by timing steps as the run goes, because the right number depends
on what else the machine runs.

kvviz spreads each one-row product over torch's threads (kvviz.models.products), so a step meets its threads at
dozens of barriers. On a quiet machine that makes it faster. On a busy one (a lecture laptop with a browser and a
video call) a thread is often off its core when the others arrive at a barrier, and they spin for it: while other
work kept this 2-core machine busy, GPT-2 124M decoded 8.0 tokens/s on two threads and 27.6 on one. Waiting
passively at the barriers (OMP_WAIT_POLICY=PASSIVE) cures the busy case but made every step on the quiet machine
half as long again (34 against 22 ms). So a run times its one-token steps: after two warm-up steps, two on its
count, and then every PROBE_EVERY steps, it takes PROBE_STEPS steps on the other count (one thread, or the count it
started with) and keeps whichever ran faster by SWITCH_MARGIN. The count is put back after every step, so nothing
else in the process (compare mode's other run, the transformers peer of a benchmark) inherits it.
"""

from __future__ import annotations

import statistics
from collections import deque

import torch

PROBE_EVERY = 32  # one-token steps between probes of the other thread count
PROBE_STEPS = 2  # steps a probe takes
WARM_UP = 2  # the run's first steps, not compared (a path's first call allocates)
SWITCH_MARGIN = 0.85  # the other count must take at most this share of the current one's time to be taken


class ThreadChooser:
    """Chooses between torch's thread count at the start of a run and one thread, step by step: `threads()` before a
    one-token step sets the count it takes, `took(seconds)` after it records its time, `restore()` at the end of
    the run puts back the count it started with."""

    def __init__(self) -> None:
        self.start = torch.get_num_threads()
        self.current = self.start
        self.steps = 0
        self.next_probe = WARM_UP + 2  # the first probe comes early: a lecture's run may be a dozen tokens
        self.recent: dict[int, deque[float]] = {self.start: deque(maxlen=4), 1: deque(maxlen=4)}
        self._running = self._last = self.start

    def _other(self) -> int:
        return 1 if self.current != 1 else self.start

    def _probing(self) -> bool:
        return self.next_probe <= self.steps < self.next_probe + PROBE_STEPS

    def threads(self) -> int:
        """The count the next one-token step takes, set on torch."""
        if self.start == 1:
            return 1
        wanted = self._other() if self._probing() else self.current
        if wanted != self._running:
            torch.set_num_threads(wanted)
            self._running = wanted
        self._last = wanted
        return wanted

    def took(self, seconds: float) -> None:
        """The step just run took `seconds`; after a probe's last step, keep the faster count."""
        if self.start == 1:
            return
        probing = self._probing()
        self.steps += 1
        if self.steps <= WARM_UP:
            return
        self.recent[self._last].append(seconds)
        if probing and self.steps == self.next_probe + PROBE_STEPS:  # the probe's last step
            other = list(self.recent[self._other()])[-PROBE_STEPS:]
            mine = self.recent[self.current]
            if mine and statistics.median(other) < SWITCH_MARGIN * statistics.median(mine):
                self.current = self._other()
            self.next_probe += PROBE_EVERY

    def restore(self) -> None:
        """Back to the count the run started with (after every step: nothing else in the process inherits it)."""
        if self._running != self.start:
            torch.set_num_threads(self.start)
            self._running = self.start
