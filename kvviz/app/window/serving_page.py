"""View > Serving: the prompts of a batch (typed one per line, or read from a prompts file), its block size, new
tokens and prefix sharing, above the serving view that steps it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.app.views.serving.serving_view import ServingView
from kvviz.app.window.dialogs import show_error
from kvviz.core.batch_records import BatchRequest
from kvviz.core.errors import KvvizError
from kvviz.core.files import MAX_PROMPTS, read_prompts

SYSTEM_PROMPT = ("You are a helpful assistant who answers questions about the plays of William Shakespeare, "
                 "briefly and kindly, quoting a line where one helps, naming the play and the act, and saying "
                 "plainly when you do not know the answer to it. Question:")  # 48 GPT-2 tokens: 6 blocks of 8
DEFAULT_PROMPTS = tuple(f"{SYSTEM_PROMPT} {q}" for q in ("Who is Hamlet?", "Where is Verona?", "What is a sonnet?",
                                                         "Why does Lear rage?"))


class ServingPage(QWidget):
    """The batch's inputs and the serving view. `request()` is the batch they ask for (None, after a dialog,
    when there is no prompt); `run_requested` fires on Run batch (or Ctrl+Enter in the prompts)."""

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
        self.view = ServingView()
        options = QHBoxLayout()
        options.addWidget(QLabel("Prompts, one per line:"))
        options.addStretch(1)
        for widget in (self.open_button, self.block_size, self.new_tokens, self.share, self.run_button):
            options.addWidget(widget)
        self.inputs = QWidget()  # the batch's settings: presenter mode hides them, as it hides the run's
        inputs = QVBoxLayout(self.inputs)
        inputs.setContentsMargins(0, 0, 0, 0)
        inputs.addLayout(options)
        inputs.addWidget(self.prompts)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.inputs)
        layout.addWidget(self.view, 1)
        self.open_button.clicked.connect(self.open_prompts_file)
        self.run_button.clicked.connect(self.run_requested)
        self.prompts.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        from PySide6.QtCore import QEvent

        if (watched is self.prompts and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and event.modifiers() & Qt.KeyboardModifier.ControlModifier):
            self.run_requested.emit()
            return True
        return False

    def set_inputs(self, prompts: tuple[str, ...], block_size: int, new_tokens: int, share: bool = True) -> None:
        self.prompts.setPlainText("\n".join(prompts))
        self.block_size.setValue(block_size)
        self.new_tokens.setValue(new_tokens)
        self.share.setChecked(share)

    def prompt_list(self) -> list[str]:
        return [line for line in self.prompts.toPlainText().splitlines() if line.strip()]

    def request(self) -> BatchRequest | None:
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

    def set_font_scale(self, scale: float) -> None:
        self.view.set_font_scale(scale)

    def set_theme(self, theme) -> None:
        self.view.set_theme(theme)
