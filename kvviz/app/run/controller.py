"""The GUI side of the one background worker (worker.py): it owns the QThread and the worker, turns method calls into
queued commands, and stops the thread when the window closes."""

from __future__ import annotations

from PySide6.QtCore import QObject, QThread, Signal

from kvviz.app.run.shared_interpreter import worker_thread_guards
from kvviz.app.run.worker import WORKER_THREADS, GenerationWorker
from kvviz.core.batch_records import BatchRequest
from kvviz.core.records import RunRequest
from kvviz.core.serve_records import ServeRequest


class WorkerController(QObject):
    """The GUI side: owns the QThread and the worker, and turns method calls into queued commands."""

    load_requested = Signal(str, str)  # source, dtype
    start_requested = Signal(str, object)  # lane, request (RunRequest, BatchRequest, ServeRequest)
    step_requested = Signal(str)  # lane
    play_requested = Signal(str, int)  # lane, interval in ms
    pause_requested = Signal()
    drop_requested = Signal(str)  # lane
    interval_changed = Signal(int)
    shutdown_requested = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        worker_thread_guards.acquire()
        self._holds_guards = True
        self.thread = QThread()
        self.thread.setObjectName("kvviz-worker")
        self.worker = GenerationWorker()
        self.worker.moveToThread(self.thread)
        self.load_requested.connect(self.worker.load_model)
        self.start_requested.connect(self.worker.start)
        self.step_requested.connect(self.worker.step)
        self.play_requested.connect(self.worker.play)
        self.pause_requested.connect(self.worker.pause)
        self.drop_requested.connect(self.worker.drop)
        self.interval_changed.connect(self.worker.set_interval)
        self.shutdown_requested.connect(self.worker.shut_down)
        self.thread.finished.connect(self.worker.deleteLater)
        WORKER_THREADS.add(self.thread)
        self.thread.start()

    def load(self, source: str, dtype: str = "float32") -> None:
        self.worker.posted += 1
        self.load_requested.emit(source, dtype)

    def start(self, lane: str, request: RunRequest | BatchRequest | ServeRequest) -> None:
        self.worker.abort.clear()
        self.worker.posted += 1
        self.start_requested.emit(lane, request)

    def step(self, lane: str) -> None:
        self.worker.posted += 1
        self.step_requested.emit(lane)

    def play(self, lane: str, interval_ms: int) -> None:
        self.play_requested.emit(lane, interval_ms)

    def drop(self, lane: str) -> None:
        self.drop_requested.emit(lane)

    def pause(self) -> None:
        self.pause_requested.emit()

    def set_interval(self, interval_ms: int) -> None:
        self.interval_changed.emit(interval_ms)

    def cancel_download(self) -> None:
        self.worker.cancel_download.set()

    def stop(self, timeout_ms: int = 1000) -> bool:
        """Abort the current pass, finish the thread and wait for it; True when it has ended."""
        if not self.thread.isRunning():
            self._release_guards()
            return True
        self.worker.abort.set()
        self.worker.cancel_download.set()
        self.shutdown_requested.emit()
        self.thread.quit()
        ended = self.thread.wait(timeout_ms)
        if ended:
            self._release_guards()
        return ended

    def wait(self) -> None:
        """Block until the thread has ended (after `stop` ran out of time during an uninterruptible load)."""
        self.thread.wait()
        self._release_guards()

    def _release_guards(self) -> None:
        if self._holds_guards:
            self._holds_guards = False
            worker_thread_guards.release()
