"""Dialogs: one-sentence errors, Help > Shortcuts, Help > About."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QMessageBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvviz import __version__
from kvviz.core.records import ModelInfo


def show_error(parent: QWidget | None, title: str, message: str) -> None:
    """A modal error with one clear sentence; the app keeps running."""
    QMessageBox.critical(parent, title, message)


def shortcut_text(action: QAction) -> str:
    return ", ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts())


class ShortcutsDialog(QDialog):
    """Help > Shortcuts: every action of the window with its keys, built from the actions themselves."""

    def __init__(self, actions: Iterable[QAction], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        rows = [(a.text().replace("&", "").rstrip("\u2026."), shortcut_text(a)) for a in actions if a.shortcuts()]
        self.table = QTableWidget(len(rows), 2, self)
        self.table.setHorizontalHeaderLabels(["Action", "Keys"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        for row, (name, keys) in enumerate(rows):
            self.table.setItem(row, 0, QTableWidgetItem(name))
            self.table.setItem(row, 1, QTableWidgetItem(keys))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        note = QLabel("Single-letter keys and Space do nothing while you type in the prompt field; "
                      "press Enter to start the run or Esc to leave the field.")
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(note)
        layout.addWidget(buttons)
        # the table scrolls: the dialog, its Close button included, fits the screen (720 px on a projector, less
        # its title bar and a taskbar)
        screen = (parent.screen() if parent is not None else self.screen()).availableGeometry()
        self.resize(520, min(screen.height() - 80, 90 + 30 * len(rows)))

    def rows(self) -> list[tuple[str, str]]:
        return [(self.table.item(r, 0).text(), self.table.item(r, 1).text()) for r in range(self.table.rowCount())]


def about_text(model: ModelInfo | None) -> str:
    """Help > About's rich text; the model's name and source are shown as typed, never as markup."""
    lines = [f"<h3>kvviz {__version__}</h3>", "<p>See the KV cache of a GPT at work, token by token.</p>"]
    if model is None:
        lines.append("<p>No model is loaded.</p>")
    else:
        lines.append(
            f"<p><b>Model:</b> {escape(model.name)}<br><b>Source:</b> {escape(model.source)}<br>"
            f"<b>Parameters:</b> {model.num_parameters:,} ({model.num_parameters / 1e6:.1f} M)<br>"
            f"<b>Shape:</b> {model.n_layer} layers, {model.n_head} heads, width {model.n_embd}, "
            f"context {model.n_ctx} tokens<br><b>Precision:</b> {model.dtype} (Run &gt; Precision)</p>"
        )
    return "".join(lines)


class AboutDialog(QDialog):
    """Help > About: the model's name, source and parameter count."""

    def __init__(self, model: ModelInfo | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About kvviz")
        self.label = QLabel(about_text(model))
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(buttons)
        self.resize(520, 220)
