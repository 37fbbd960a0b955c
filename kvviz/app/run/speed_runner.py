"""The speed sweeps in the background: `kvviz bench --sweep` (cached against uncached) or the long sweep
(`--variants all`: every kind of cache against the bandwidth bound) in a child process, its progress and its
result as signals. A process of its own loads its own copy of the model, so the sweep neither shares the worker's
model nor takes the GUI thread's interpreter lock; cancelling ends it at once."""

from __future__ import annotations

import json
import os
import signal
import sys

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

from kvviz.core.errors import KvvizError
from kvviz.measure.cache_speed import CacheSweepResult
from kvviz.measure.speed import SweepResult

PROGRESS_PREFIX = "progress "
PARTIAL_PREFIX = "partial "


def sweep_arguments(source: str, dtype: str, max_length: int | None = None) -> list[str]:
    """The command line (after the interpreter) that sweeps model `source` ("" = the embedded one)."""
    arguments = ["-m", "kvviz", "bench", "--sweep", "--json", "--background", "--dtype", dtype]
    if source:
        arguments += ["--model", source]
    if max_length is not None:
        arguments += ["--max-length", str(max_length)]
    return arguments


def long_sweep_arguments(source: str, dtype: str, max_length: int | None = None) -> list[str]:
    """The long sweep's command line (after the interpreter): every kind of cache model `source` ("" = the
    embedded one) runs, at lengths doubling up to `max_length` (None: as far as the command goes)."""
    arguments = sweep_arguments(source, dtype, max_length)
    return [*arguments[:4], "--variants", "all", *arguments[4:]]


class SpeedSweeper(QObject):
    """Runs one sweep at a time: `start(source, dtype)` (a running one is cancelled first), `cancel()`.
    `result` keeps the last finished sweep, with the source and dtype it measured. A `long` sweeper runs the
    long sweep: its results are CacheSweepResult (kvviz.measure.cache_speed), its partial results too."""

    started = Signal(str, str)  # source, dtype
    progressed = Signal(int, int)  # measurements done, of total
    measured_part = Signal(object)  # SweepResult (CacheSweepResult) of the lengths measured so far
    paused_changed = Signal(bool)
    finished = Signal(object)  # SweepResult (CacheSweepResult)
    failed = Signal(str)  # one sentence
    cancelled = Signal()

    def __init__(self, parent: QObject | None = None, long: bool = False) -> None:
        super().__init__(parent)
        self.long = long
        self._arguments = long_sweep_arguments if long else sweep_arguments
        self._read = CacheSweepResult.from_dict if long else SweepResult.from_dict
        self._what = "The long speed sweep" if long else "The speed sweep"
        self.result: SweepResult | CacheSweepResult | None = None
        self.measured: tuple[str, str] | None = None  # (source, dtype) of `result`
        self._asked: tuple[str, str] | None = None
        self._process: QProcess | None = None
        self._stderr = b""
        self._errors: list[str] = []
        self.paused = False

    def pause(self, on: bool) -> None:
        """Stop the sweep's process while the live run computes (`on`), and let it go on after: it never
        competes with a step the lecturer is waiting for. A turn timed across a pause is one of several whose
        median counts. Where processes cannot be stopped (Windows), it runs at the lowest priority only."""
        process = self._process
        if process is None or on == self.paused or not hasattr(signal, "SIGSTOP"):
            return
        pid = process.processId()
        if pid <= 0:
            return
        try:
            os.kill(pid, signal.SIGSTOP if on else signal.SIGCONT)
        except OSError:
            return
        self.paused = on
        self.paused_changed.emit(on)

    @property
    def running(self) -> bool:
        return self._process is not None

    @property
    def running_for(self) -> tuple[str, str] | None:
        """(source, dtype) of the sweep under way, if any."""
        return self._asked if self._process is not None else None

    def start(self, source: str, dtype: str = "float32", max_length: int | None = None) -> None:
        self.cancel()
        process = QProcess(self)
        environment = QProcessEnvironment.systemEnvironment()
        environment.insert("PYTHONIOENCODING", "utf-8")
        process.setProcessEnvironment(environment)
        process.readyReadStandardError.connect(self._on_stderr)
        process.finished.connect(self._on_finished)
        process.errorOccurred.connect(self._on_error)
        self._process, self._asked, self._stderr, self._errors = process, (source, dtype), b"", []
        process.start(sys.executable, self._arguments(source, dtype, max_length))
        self.started.emit(source, dtype)

    def cancel(self) -> None:
        """Stop the sweep under way, if any (its process is killed and reaped)."""
        process = self._process
        if process is None:
            return
        self.pause(False)  # its process is killed whether stopped or not; `paused` goes back with it
        self._process = None
        process.blockSignals(True)
        process.kill()
        process.waitForFinished(2000)
        process.deleteLater()
        self.cancelled.emit()

    def _on_stderr(self) -> None:
        process = self._process
        if process is None:
            return
        self._stderr += bytes(process.readAllStandardError().data())
        *lines, self._stderr = self._stderr.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith(PROGRESS_PREFIX):
                done, _, total = line[len(PROGRESS_PREFIX):].partition("/")
                if done.isdigit() and total.isdigit():
                    self.progressed.emit(int(done), int(total))
            elif line.startswith(PARTIAL_PREFIX):
                try:
                    self.measured_part.emit(self._read(json.loads(line[len(PARTIAL_PREFIX):])))
                except (ValueError, KvvizError):
                    pass  # a curve drawn later, from the whole result
            elif line:
                self._errors.append(line)

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and self._process is not None:
            self._process.deleteLater()
            self._process = None
            self.failed.emit(f"{self._what} could not start ({sys.executable}).")

    def _on_finished(self, exit_code: int, exit_status: QProcess.ExitStatus) -> None:
        process = self._process
        if process is None:
            return
        self._on_stderr()
        self._process = None
        self.paused = False
        output = bytes(process.readAllStandardOutput().data()).decode("utf-8", "replace")
        process.deleteLater()
        if exit_status != QProcess.ExitStatus.NormalExit or exit_code != 0:
            last = next((line for line in reversed(self._errors) if line), "")
            reason = last.removeprefix("kvviz: ") or f"it ended with status {exit_code}"
            self.failed.emit(f"{self._what} failed: {reason}")
            return
        try:
            result = self._read(json.loads(output))
        except (ValueError, KvvizError) as exc:
            self.failed.emit(f"{self._what} printed no result ({exc}).")
            return
        self.result, self.measured = result, self._asked
        self.finished.emit(result)
