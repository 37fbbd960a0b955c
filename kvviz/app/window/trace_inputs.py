"""The serving page's inputs for a trace: which trace (the built-in one, or a file read through a dialog) and the
server it runs on (prefix cache, prefill chunk, blocks in the pool, block size). A trace that cannot be read is a
dialog with its one line, and nothing runs."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QPushButton, QSpinBox, QWidget

from kvviz.app.window.dialogs import show_error
from kvviz.core.serve_records import PREFIX_CACHES, ServeRequest
from kvviz.core.trace import TraceError, read_trace

BUILT_IN = "built-in trace"
CACHE_CHOICES = {"radix": "prefix cache: radix tree", "hash": "prefix cache: block hashes",
                 "off": "prefix cache: off"}
MAX_BLOCKS = 4096  # as kvviz serve-trace's --blocks
MAX_CHUNK = 4096


class TraceInputs(QWidget):
    """`request()` is the trace these inputs ask for (None, after a dialog, when the trace cannot be read);
    `run_requested` fires on Run trace, on another trace chosen and on a trace file opened."""

    run_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        defaults = ServeRequest(0)
        self.source = QComboBox()
        self.source.addItem(BUILT_IN, "")  # the data: the file's path ("": the built-in trace)
        self.source.setToolTip("The trace served: requests that arrive over time (JSON lines of arrive_at_pass, "
                               "prompt, max_new_tokens)")
        self.open_button = QPushButton("Open trace file\u2026")
        self.prefix_cache = QComboBox()
        for key in PREFIX_CACHES[::-1]:  # radix first: the default
            self.prefix_cache.addItem(CACHE_CHOICES[key], key)
        self.prefix_cache.setCurrentIndex(self.prefix_cache.findData(defaults.prefix_cache))
        self.prefix_cache.setToolTip("Blocks that outlive their requests: found by SGLang's radix tree of tokens, by "
                                     "vLLM's block hashes, or not kept at all")
        self.chunk = _spin(0, MAX_CHUNK, defaults.chunk, "chunk ", "A prompt is prefilled this many tokens a pass at "
                           "most, mixed with the other requests' decode steps (0: a whole prompt in one pass)")
        self.chunk.setSpecialValueText("chunk off")
        self.blocks = _spin(1, MAX_BLOCKS, defaults.num_blocks, "blocks ", "Blocks in the pool: a small pool makes "
                            "the scheduler preempt the youngest request")
        self.block_size = _spin(1, 256, defaults.block_size, "block size ", "Positions a block of the pool holds")
        self.run_button = QPushButton("Run trace")
        self.run_button.setObjectName("primary")
        self.run_button.setToolTip("Plan the trace anew with these settings (R); Step and Play above then run it")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        for widget in (self.source, self.open_button, self.prefix_cache, self.chunk, self.blocks, self.block_size):
            row.addWidget(widget)
        row.addStretch(1)
        row.addWidget(self.run_button)
        self.open_button.clicked.connect(lambda: self.open_trace_file())
        self.source.activated.connect(lambda _index: self.run_requested.emit())
        self.run_button.clicked.connect(self.run_requested)

    @property
    def trace_path(self) -> str | None:
        return self.source.currentData() or None

    def request(self) -> ServeRequest | None:
        """The trace and the server of the inputs; the trace is read and checked here first (a dialog says why it
        cannot run, and None)."""
        path = self.trace_path
        try:
            read_trace(path)
        except TraceError as exc:
            show_error(self, "Trace not read", str(exc))
            return None
        return ServeRequest(0, path, self.prefix_cache.currentData(), self.chunk.value(), self.block_size.value(),
                            self.blocks.value())

    def set_request(self, request: ServeRequest) -> None:
        """Show `request`'s trace and server (a lesson's, ServingMode.run_trace)."""
        self._choose(request.trace_path)
        self.prefix_cache.setCurrentIndex(self.prefix_cache.findData(request.prefix_cache))
        self.chunk.setValue(request.chunk)
        self.blocks.setValue(request.num_blocks)
        self.block_size.setValue(request.block_size)

    def open_trace_file(self, path: str | None = None) -> bool:
        """Read a trace file (a dialog asks for it when `path` is None) and run it; one that cannot be read is a
        dialog with its one line, and the trace shown stays."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open trace file", "",
                                                  "Traces (*.jsonl *.json *.txt);;All files (*)")
            if not path:
                return False
        try:
            read_trace(path)
        except TraceError as exc:
            show_error(self, "Trace not read", str(exc))
            return False
        self._choose(path)
        self.run_requested.emit()
        return True

    def _choose(self, path: str | None) -> None:
        index = self.source.findData(path or "")
        if index < 0:
            self.source.addItem(Path(path).name, path)
            index = self.source.count() - 1
            self.source.setItemData(index, path, Qt.ItemDataRole.ToolTipRole)
        self.source.setCurrentIndex(index)


def _spin(low: int, high: int, value: int, prefix: str, tip: str) -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    box.setPrefix(prefix)
    box.setToolTip(tip)
    return box
