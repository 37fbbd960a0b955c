"""What the GUI thread and a worker thread need while they share one Python interpreter.

Python's automatic garbage collection is off and the GUI thread collects on a timer instead. The
automatic collector runs on whichever thread happens to allocate; when that is the worker, it
destroys Qt widgets caught in reference cycles (a closed window, a chart built for an export) on
the wrong thread, and Qt aborts or deadlocks. pyqtgraph's GarbageCollector does the same for the
same reason. After each model load everything alive is frozen (`settle`), so the full collections
the GUI thread makes later stay short.

The GIL keeps Python's own switch interval (5 ms). A shorter one (1 ms, and 0.1 ms while the GUI thread drew)
was measured with `kvviz bench --gui` on 2026-12-04 and went: it changed neither the GUI's stall nor its speed
(random:gpt2, 100 tokens: stall 8.1 and 7.8 ms with it, 6.5 and 7.4 ms without; GUI autoplay 26.3 and 26.1
tokens/s with it, 26.8 and 29.4 without; the embedded model alike).
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication, QTimer

GUI_COLLECT_INTERVAL_MS = 50


class WorkerThreadGuards:
    """The collection above while any worker thread exists, and Python's own once the last has ended.
    Create and release it on the GUI thread."""

    def __init__(self) -> None:
        self._holders = 0
        self._gc_was_enabled = gc.isenabled()
        self._timer: QTimer | None = None
        self._collector: GuiThreadCollector | None = None

    def acquire(self) -> None:
        if self._holders == 0:
            self._gc_was_enabled = gc.isenabled()
            gc.disable()
            self._collector = GuiThreadCollector()
            self._timer = QTimer(QCoreApplication.instance())
            self._timer.setInterval(GUI_COLLECT_INTERVAL_MS)
            self._timer.timeout.connect(self._collector.collect)
            self._timer.start()
        self._holders += 1

    def hold_old_generations(self, hold: bool) -> None:
        """While autoplay runs, collect only the youngest generation (a few ms); the older ones, whose
        collections take tens of ms, wait for the pause."""
        if self._collector is not None:
            self._collector.hold_old = hold

    def settle(self, replaced: bool = True) -> None:
        """After a model load (the GUI thread, while the load's own pause lasts): collect, then freeze what is
        left, so that later full collections only look at objects made since. What was frozen and later became
        garbage is collected at the next full settle or at release.

        A load that `replaced` a model collects everything once (the old model's garbage goes now). The window's
        first load collects only the young generations: nothing large has become garbage since the window
        started, and a full collection of a process with torch imported took 130 ms at the app's start, and a
        tenth of the test suite's GUI time (py-spy, 2026-12-04)."""
        if self._holders == 0:
            return
        if replaced:
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()
        if self._collector is not None:
            self._collector.rebase()

    @property
    def active(self) -> bool:
        """A worker thread exists."""
        return self._holders > 0

    def release(self) -> None:
        if self._holders == 0:
            return
        self._holders -= 1
        if self._holders == 0:
            if self._timer is not None:
                self._timer.stop()
                self._timer.deleteLater()
                self._timer, self._collector = None, None
            gc.unfreeze()
            if self._gc_was_enabled:
                gc.enable()


class GuiThreadCollector:
    """Python's generational collection, run from a timer on the GUI thread: the youngest generation
    on every tick that has new objects, an older one once the one below has been collected past its
    threshold, and everything only once a quarter more objects have become long-lived (CPython's rules)."""

    def __init__(self) -> None:
        # counted when first needed: listing the oldest generation of a large process takes tens of ms
        self._long_lived_total: int | None = None
        self.hold_old = False  # only the youngest generation for now (autoplay)

    def rebase(self) -> None:
        """Count long-lived objects afresh (after a freeze)."""
        self._long_lived_total = len(gc.get_objects(generation=2))

    def collect(self) -> int:
        """Collect what Python would have by now; returns the number of unreachable objects found."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        if self.hold_old:
            return gc.collect(0) if counts[0] > 0 else 0
        if counts[1] > thresholds[1] and counts[2] > thresholds[2]:
            long_lived = len(gc.get_objects(generation=2))
            if self._long_lived_total is None:
                self._long_lived_total = long_lived
            if long_lived - self._long_lived_total > self._long_lived_total // 4:
                found = gc.collect(2)
                self._long_lived_total = len(gc.get_objects(generation=2))
                return found
        if counts[1] > thresholds[1]:
            return gc.collect(1)
        return gc.collect(0) if counts[0] > 0 else 0

worker_thread_guards = WorkerThreadGuards()
