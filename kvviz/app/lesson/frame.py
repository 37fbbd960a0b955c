"""The frame that points the audience at one view during a lesson: an outline drawn over the view a step's focus
names, following it as the window's layout moves it."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QRect, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme

FRAME_WIDTH = 3  # pixels

class FocusFrame(QWidget):
    """A thin outline drawn over one view (or a part of one) to point the audience at it.

    It lies on top of `host` (an ancestor of every view it frames, outside the exported views), lets
    the mouse through, and follows its target when anything between the two moves or resizes.
    """

    def __init__(self, host: QWidget) -> None:
        super().__init__(host)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self.setAttribute(Qt.WidgetAttribute.WA_NoSystemBackground, True)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self._host = host
        self._target: QWidget | None = None
        self._part: Callable[[], QRect | None] | None = None
        self._watched: list[QObject] = []
        self._colour = themes.current().frame
        self.hide()

    def set_theme(self, theme: Theme) -> None:
        self._colour = theme.frame
        self.update()

    @property
    def target(self) -> QWidget | None:
        return self._target

    def frame(self, target: QWidget | None, part: Callable[[], QRect | None] | None = None) -> None:
        """Outline `target` (None: nothing), or the rectangle `part()` gives in its coordinates."""
        for watched in self._watched:
            watched.removeEventFilter(self)
        self._watched = []
        self._target, self._part = target, part
        widget = target
        while widget is not None and widget is not self._host:
            widget.installEventFilter(self)
            self._watched.append(widget)
            widget = widget.parentWidget()
        self.follow()

    def follow(self) -> None:
        """Put the frame over its target again (hidden while the target is)."""
        target = self._target
        if target is None or not target.isVisibleTo(self._host):
            self.hide()
            return
        rect = self._part() if self._part is not None else None
        if rect is None:
            rect = target.rect()
        top_left = target.mapTo(self._host, rect.topLeft())
        self.setGeometry(QRect(top_left, rect.size()))
        self.raise_()
        self.show()
        self.update()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.Resize, QEvent.Type.Move, QEvent.Type.Show, QEvent.Type.Hide,
                            QEvent.Type.LayoutRequest):
            self.follow()
        return False

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        pen = QPen(QColor(self._colour))
        pen.setWidth(FRAME_WIDTH)
        painter.setPen(pen)
        half = FRAME_WIDTH / 2
        painter.drawRoundedRect(self.rect().toRectF().adjusted(half, half, -half, -half), 6, 6)
        painter.end()
