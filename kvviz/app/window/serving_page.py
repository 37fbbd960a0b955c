"""View > Serving: a batch (its prompts typed one per line or read from a prompts file, its block size, new tokens
and prefix sharing) or a trace of requests that arrive over time (kvviz.app.window.trace_inputs), above the serving
view that steps it: the batch's or the trace's, whichever kind of run was planned last."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvviz.app.views.serving.serving_view import ServingView
from kvviz.app.views.serving.trace_view import TraceView
from kvviz.app.window.dialogs import show_error
from kvviz.app.window.trace_inputs import TraceInputs
from kvviz.core.batch_records import BatchRequest, BatchSpeed
from kvviz.core.errors import KvvizError
from kvviz.core.files import MAX_PROMPTS, read_prompts
from kvviz.core.serve_records import ServeMeasure, ServePlan, ServeRequest

BATCH, TRACE = "batch", "trace"

SYSTEM_PROMPT = ("You are a helpful assistant who answers questions about the plays of William Shakespeare, "
                 "briefly and kindly, quoting a line where one helps, naming the play and the act, and saying "
                 "plainly when you do not know the answer to it. Question:")  # 48 GPT-2 tokens: 6 blocks of 8
DEFAULT_PROMPTS = tuple(f"{SYSTEM_PROMPT} {q}" for q in ("Who is Hamlet?", "Where is Verona?", "What is a sonnet?",
                                                         "Why does Lear rage?"))


class ServingPage(QWidget):
    """The inputs of a batch or a trace and the serving view. `request()` is the batch or the trace they ask for
    (None, after a dialog, when there is no prompt or the trace cannot be read); `run_requested` fires on Run batch
    (or Ctrl+Enter in the prompts), Run trace, a trace chosen, and Batch or Trace chosen.

    The page is the view the serving mode's redraw scheduler feeds (the view protocol): a plan goes to the view of
    its kind, `view` (a batch's) or `trace_view` (a trace's), which is then the one shown."""

    run_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("central")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.prompts = QPlainTextEdit("\n".join(DEFAULT_PROMPTS))
        self.prompts.setObjectName("servingPrompts")
        self.prompts.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.prompts.setToolTip("One request's prompt per line (blank lines are skipped); Ctrl+Enter runs them")
        self.prompts.setFixedHeight(QFontMetrics(self.prompts.font()).lineSpacing() * 3 + 14)
        self.open_button = QPushButton("Open prompts file\u2026")
        self.block_size = QSpinBox()
        self.block_size.setRange(1, 256)
        self.block_size.setValue(8)
        self.block_size.setPrefix("block size ")
        self.new_tokens = QSpinBox()
        self.new_tokens.setRange(1, 256)
        self.new_tokens.setValue(16)
        self.new_tokens.setPrefix("new tokens ")
        self.share = QCheckBox("share prefixes")
        self.share.setChecked(True)
        self.share.setToolTip("Blocks whose tokens (and all before them) another request holds are stored once")
        self.run_button = QPushButton("Run batch")
        self.run_button.setObjectName("primary")
        self.run_button.setToolTip("Plan the batch anew from these prompts (R); Step and Play above then run it")
        self.view = ServingView()  # a batch's
        self.trace_view = TraceView()  # a trace's: shown instead once a trace is planned
        self.trace_view.hide()
        self.batch_choice = _kind_button("&Batch", "Serve a batch of prompts that start together (Alt+B)")
        self.trace_choice = _kind_button("&Trace", "Serve a trace: requests that arrive over time, a scheduler that "
                                         "admits, chunks and preempts them, a prefix cache across requests (Alt+T)")
        self.batch_choice.setChecked(True)
        self._kinds = QButtonGroup(self)  # exclusive: one of the two is chosen
        for button in (self.batch_choice, self.trace_choice):
            self._kinds.addButton(button)
        self.trace_inputs = TraceInputs()
        self.batch_options = QWidget()
        options = QHBoxLayout(self.batch_options)
        options.setContentsMargins(0, 0, 0, 0)
        options.addWidget(QLabel("Prompts, one per line:"))
        options.addStretch(1)
        for widget in (self.open_button, self.block_size, self.new_tokens, self.share, self.run_button):
            options.addWidget(widget)
        top = QHBoxLayout()
        top.setSpacing(0)
        top.addWidget(self.batch_choice)
        top.addWidget(self.trace_choice)
        top.addSpacing(12)
        top.addWidget(self.batch_options, 1)
        top.addWidget(self.trace_inputs, 1)
        self.trace_inputs.hide()
        self.inputs = QWidget()  # the batch's or the trace's settings: presenter mode hides them, as the run's
        inputs = QVBoxLayout(self.inputs)
        inputs.setContentsMargins(0, 0, 0, 0)
        inputs.addLayout(top)
        inputs.addWidget(self.prompts)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.inputs)
        layout.addWidget(self.view, 1)  # one of the two views shows (a stack would take the taller's height)
        layout.addWidget(self.trace_view, 1)
        self.open_button.clicked.connect(self.open_prompts_file)
        self.run_button.clicked.connect(self.run_requested)
        self.trace_inputs.run_requested.connect(self.run_requested)
        self._kinds.buttonClicked.connect(self._on_kind_chosen)
        self.prompts.installEventFilter(self)

    # ----- batch or trace -----
    @property
    def kind(self) -> str:
        """What the inputs ask for: BATCH or TRACE."""
        return TRACE if self.trace_choice.isChecked() else BATCH

    def set_kind(self, kind: str) -> None:
        """Show the inputs of `kind` (nothing runs: its view shows when its run is planned)."""
        (self.trace_choice if kind == TRACE else self.batch_choice).setChecked(True)
        trace = kind == TRACE
        self.trace_inputs.setVisible(trace)
        self.batch_options.setVisible(not trace)
        self.prompts.setVisible(not trace)

    def _on_kind_chosen(self, _button) -> None:
        self.set_kind(self.kind)
        self.run_requested.emit()

    @property
    def shown_view(self) -> ServingView | TraceView:
        """The view of the kind of run planned last."""
        return self.trace_view if self.trace_view.isVisibleTo(self) else self.view

    def eventFilter(self, watched, event) -> bool:
        from PySide6.QtCore import QEvent

        if (watched is self.prompts and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and event.modifiers() & Qt.KeyboardModifier.ControlModifier):
            self.run_requested.emit()
            return True
        return False

    def set_inputs(self, prompts: tuple[str, ...], block_size: int, new_tokens: int, share: bool = True) -> None:
        """A batch's inputs (a lesson's serving step), Batch chosen."""
        self.set_kind(BATCH)
        self.prompts.setPlainText("\n".join(prompts))
        self.block_size.setValue(block_size)
        self.new_tokens.setValue(new_tokens)
        self.share.setChecked(share)

    def set_trace(self, request: ServeRequest) -> None:
        """A trace's inputs (ServingMode.run_trace), Trace chosen."""
        self.set_kind(TRACE)
        self.trace_inputs.set_request(request)

    def prompt_list(self) -> list[str]:
        return [line for line in self.prompts.toPlainText().splitlines() if line.strip()]

    def request(self) -> BatchRequest | ServeRequest | None:
        if self.kind == TRACE:
            return self.trace_inputs.request()
        prompts = self.prompt_list()
        if not prompts:
            show_error(self, "No prompt", "Type at least one prompt, one per line, or open a prompts file.")
            return None
        if len(prompts) > MAX_PROMPTS:
            show_error(self, "Too many prompts", f"A batch takes at most {MAX_PROMPTS} prompts; this has "
                                                 f"{len(prompts)}.")
            return None
        return BatchRequest(0, tuple(prompts), self.new_tokens.value(), self.block_size.value(),
                            self.share.isChecked())

    def open_prompts_file(self, path: str | None = None) -> bool:
        """Read a prompts file into the list (a dialog says why one cannot be read; the list is kept)."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open prompts file", "", "Text files (*.txt);;All files (*)")
            if not path:
                return False
        try:
            prompts = read_prompts(path)
        except KvvizError as exc:
            show_error(self, "Prompts not read", str(exc))
            return False
        self.prompts.setPlainText("\n".join(prompts))
        self.run_requested.emit()
        return True

    def focus_view(self) -> None:
        """Keyboard focus on the shown view (the keys step its run; none of them types)."""
        (self.trace_view.timeline if self.shown_view is self.trace_view else self.view.pool).setFocus()

    # ----- the view protocol, for the view of the plan's kind -----
    def reset(self, plan) -> None:
        """A new batch (BatchPlan) or trace (ServePlan): its view shown, reset."""
        trace = isinstance(plan, ServePlan)
        self.view.setVisible(not trace)
        self.trace_view.setVisible(trace)
        self.shown_view.reset(plan)

    def apply(self, records: Sequence) -> None:
        self.shown_view.apply(records)

    def refresh(self) -> None:
        self.shown_view.refresh()

    def show_measured(self, measured: BatchSpeed | ServeMeasure | None) -> None:
        """What the worker measured after the last pass: a batch's speed, a trace's figures."""
        if isinstance(measured, ServeMeasure):
            self.trace_view.show_measure(measured)
        else:
            self.view.show_speed(measured)

    def clear(self, text: str) -> None:
        self.view.clear(text)
        self.trace_view.clear(text)

    def set_font_scale(self, scale: float) -> None:
        self.view.set_font_scale(scale)
        self.trace_view.set_font_scale(scale)

    def set_theme(self, theme) -> None:
        self.view.set_theme(theme)
        self.trace_view.set_theme(theme)


def _kind_button(text: str, tip: str) -> QToolButton:
    """One of the two choices, Batch and Trace, side by side (the chosen one in the primary button's colours)."""
    button = QToolButton()
    button.setObjectName("servingKind")
    button.setText(text)
    button.setToolTip(tip)
    button.setCheckable(True)
    return button
