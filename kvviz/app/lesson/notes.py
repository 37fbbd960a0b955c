"""The lecturer's notes on a lesson step: their label and the button (or action) that shows and hides them."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QToolButton


class LessonNotes:
    """The step's notes (`label`: small, hidden until shown) and the `button` that shows them; once given
    an action (`set_action`), the button is the action's and the action shows and hides them."""

    def __init__(self) -> None:
        self._shown = False
        self._action: QAction | None = None
        self.button = QToolButton()
        self.button.setText("notes")
        self.button.setCheckable(True)
        self.button.setChecked(False)
        self.button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.button.setToolTip("Show or hide the lecturer's notes (N; hidden again in presenter mode)")
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
        self.button.setVisible(bool(text))
        self._on_toggled(self._shown)

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
        self.label.setVisible(shown and bool(self.label.text()))
