"""File > Export... from the main window: the dialog opened on what the window shows, and a word to the user on
where the file went."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QDialog, QLabel, QMainWindow

from kvviz.app.export.animation import AnimationSource
from kvviz.app.export.caption import make_caption
from kvviz.app.export.dialog import ExportDialog

if TYPE_CHECKING:
    from kvviz.app.run.session import RunSession
    from kvviz.app.views.status import StatusLine

NOTE_SECONDS = 8  # how long presenter mode's note says where an export went


def export_from_window(window: QMainWindow, session: RunSession, status: StatusLine, targets: Callable[[], dict],
                       prompt: str, redraw: Callable[[], None]) -> None:
    """File > Export...: pause the session's run, draw its latest state (`redraw`), and open the dialog on what
    the window shows (`targets`), captioned with the run's prompt (else `prompt`, the one typed), model and step."""
    session.pause()
    redraw()
    plan, record, info = session.plan, session.last_record, session.model_info
    step = record.step + 1 if record is not None else None
    dtype = info.dtype if info else None
    caption = make_caption(plan.prompt if plan else prompt,
                           info.name if info else "no model", step, record.new_tokens if record else None,
                           plan.use_cache if plan else None, compare=plan is not None and plan.twin is not None,
                           cache_broken=plan is not None and plan.cache_broken, dtype=dtype)
    animation = AnimationSource(plan, tuple(session.records), dtype) if plan is not None and session.records else None
    dialog = ExportDialog(targets(), caption, window, step=step, animation=animation)
    if dialog.exec() == QDialog.DialogCode.Accepted and dialog.written is not None:
        say_where(window, status, dialog.written_as(), dialog.written)


def say_where(window: QMainWindow, status: StatusLine, what: str, path: Path) -> None:
    """Tell the window's user where an export went: on the status line until the run moves on, and in presenter
    mode, where the status bar is hidden, in a note over the bottom of the window for NOTE_SECONDS (over the
    views, not among them: showing and hiding it moves nothing)."""
    message = f"Exported {what} to {path}"
    status.show_message(message, sticky=False)
    if window.statusBar().isVisible():
        return
    note = QLabel(message, window)
    note.setObjectName("banner")  # the banner's look (kvviz.qss)
    note.setProperty("alert", "false")
    note.ensurePolished()  # the style sheet's font (presenter mode's size) before measuring
    margin = 12
    room = window.width() - 2 * margin
    if note.sizeHint().width() > room:  # one line when it fits, else wrapped to the window's width
        note.setWordWrap(True)
        note.setFixedWidth(room)
    note.adjustSize()
    note.move(margin, window.height() - note.height() - margin)
    note.show()
    note.raise_()
    window.export_note = note
    QTimer.singleShot(round(NOTE_SECONDS * 1000), note, note.deleteLater)
