"""The lecturer's notes on a lesson step: their label and the button (or action) that shows and hides them."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication
from PySide6.QtWidgets import QLabel, QScrollArea, QToolButton, QVBoxLayout, QWidget

NOTES_WINDOW_TITLE = "Lecturer's notes \u2014 kvviz"


class NotesWindow(QWidget):
    """The notes in a window of their own, for presenter mode: the projected window never shows them. It opens on
    a screen other than the main window's when there is one (the lecturer's laptop beside the projector)."""

    closed = Signal()

    def __init__(self, main: QWidget) -> None:
        super().__init__(None, Qt.WindowType.Window)
        self._main = main
        self.setWindowTitle(NOTES_WINDOW_TITLE)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        font = self.text.font()
        font.setPointSizeF(font.pointSizeF() * 1.4)  # read from a laptop at arm's length
        self.text.setFont(font)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.text)
        layout = QVBoxLayout(self)
        layout.addWidget(scroll)
        self.resize(560, 360)

    def place(self) -> None:
        """On another screen than the main window's, if there is one; else beside the main window's centre."""
        here = self._main.screen()
        others = [screen for screen in QGuiApplication.screens() if screen is not here]
        area = (others[0] if others else here).availableGeometry()
        self.move(area.left() + max(0, (area.width() - self.width()) // 2),
                  area.top() + max(0, (area.height() - self.height()) // 2))

    def closeEvent(self, event: QCloseEvent) -> None:
        super().closeEvent(event)
        self.closed.emit()


class LessonNotes:
    """The step's notes (`label`: small, hidden until shown) and the `button` that shows them; once given
    an action (`set_action`), the button is the action's and the action shows and hides them."""

    def __init__(self) -> None:
        self._shown = False
        self._detached_for: QWidget | None = None  # presenter mode: the main window the notes keep off (set_detached)
        self._window: NotesWindow | None = None
        self._action: QAction | None = None
        self.button = QToolButton()
        self.button.setText("notes")
        self.button.setCheckable(True)
        self.button.setChecked(False)
        self.button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.button.setToolTip("Show or hide the lecturer's notes (N; in presenter mode in a window of their own)")
        self.button.toggled.connect(self._on_toggled)
        self.label = QLabel()
        self.label.setObjectName("muted")
        self.label.setWordWrap(True)

    @property
    def shown(self) -> bool:
        return self._shown

    def set_text(self, text: str) -> None:
        """The step's notes (none: no button)."""
        self.label.setText(text)
        if self._window is not None:
            self._window.text.setText(text or "(no notes for this step)")
        self.button.setVisible(bool(text))
        self._on_toggled(self._shown)

    def set_detached(self, main: QWidget | None) -> None:
        """Presenter mode (`main`, the projected window): shown, the notes go in a window of their own, never on
        `main`; None: back in the panel (their window closed)."""
        self._detached_for = main
        if main is None and self._window is not None:
            self._window.closed.disconnect(self._on_window_closed)
            self._window.close()
            self._window.deleteLater()
            self._window = None
        self._on_toggled(self._shown)

    @property
    def window(self) -> NotesWindow | None:
        """The notes' own window (presenter mode, shown), else None."""
        return self._window

    def set_action(self, action: QAction) -> None:
        """Let `action` (checkable) show and hide the notes; the button becomes its button."""
        if action is self._action:
            return
        self._action = action
        action.setIconText("notes")
        action.setToolTip(self.button.toolTip())
        self.button.toggled.disconnect(self._on_toggled)
        self.button.setDefaultAction(action)
        action.toggled.connect(self._on_toggled)
        self._on_toggled(action.isChecked())

    def set_shown(self, shown: bool) -> None:
        """Show or hide the notes, checking the action (or the button) to match."""
        if self._action is not None:
            self._action.setChecked(shown)
        else:
            self.button.setChecked(shown)
        self._on_toggled(shown)

    def _on_toggled(self, shown: bool) -> None:
        self._shown = shown
        detached = self._detached_for is not None
        self.label.setVisible(shown and not detached and bool(self.label.text()))
        if detached and shown:
            if self._window is None:
                self._window = NotesWindow(self._detached_for)
                self._window.closed.connect(self._on_window_closed)
                self._window.text.setText(self.label.text() or "(no notes for this step)")
                self._window.place()
            self._window.show()
            self._window.raise_()
            self._detached_for.activateWindow()  # the keys stay with the lesson
        elif self._window is not None:
            self._window.hide()

    def _on_window_closed(self) -> None:
        if self._shown:
            self.set_shown(False)
