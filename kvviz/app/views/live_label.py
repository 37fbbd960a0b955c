"""A label for text that changes on every redraw, without relayouts."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QAbstractTextDocumentLayout, QPainter, QPaintEvent, QPalette, QTextDocument, QTextOption
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class LiveLabel(QLabel):
    """A QLabel (same style-sheet selectors, `text()`, `setText`) for a view's running caption or number.

    QLabel.setText asks every layout from the label up to the window to redo itself, on every call;
    in a run that redraws a dozen labels a second, those relayouts were a third of the GUI thread's
    time and resized (and fully repainted) plots beside the label. A LiveLabel keeps the room it needs
    for its longest text so far and for the text given to `reserve` (a run's widest numbers, known
    from the plan), and a new text that fits in that room only repaints the label. Rich text unless
    `rich=False`; with `wrap`, lines break at the label's width and the room is a height for that
    width.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None, *, rich: bool = True,
                 wrap: bool = False) -> None:
        super().__init__(parent)
        self._rich, self._wrap = rich, wrap
        self._text = ""
        self._reserved = ""
        self._room = QSize(0, 0)  # the largest size asked for so far, at the width last laid out
        self._answered: dict[int, int] = {}  # wrapped: the heights heightForWidth gave, by width
        # as QLabel, centred vertically; a wrapped caption stays at the top of its room instead
        vertical = Qt.AlignmentFlag.AlignTop if wrap else Qt.AlignmentFlag.AlignVCenter
        self._alignment = Qt.AlignmentFlag.AlignLeft | vertical
        # the measured sizes of the reserved text and the current one (a layout pass asks for the same width several
        # times: a text document laid out each time was a tenth of the window's start)
        self._sizes: dict[tuple[str, int | None], QSize] = {}
        self._document = self._new_document()
        if wrap:
            policy = self.sizePolicy()
            policy.setHeightForWidth(True)
            policy.setHorizontalPolicy(QSizePolicy.Policy.Preferred)
            self.setSizePolicy(policy)
        self.setText(text)

    # ----- QLabel's interface -----
    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:
        if text == self._text:
            return
        self._sizes = {key: size for key, size in self._sizes.items() if key[0] == self._reserved}
        self._text = text
        self._fill(self._document, text)
        if self._needs_more_room():
            self.updateGeometry()
        self.update()

    def wordWrap(self) -> bool:
        return self._wrap

    def setAlignment(self, alignment: Qt.AlignmentFlag) -> None:
        self._alignment = alignment
        self.update()

    def reserve(self, text: str) -> None:
        """Keep room for `text` too (for instance a run's final numbers), so that the run's growing
        texts never change the label's size."""
        self._reserved = text
        self._room = QSize(0, 0)
        self._sizes = {}
        self._answered = {}
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        width = max(self._ideal_width(t) for t in (self._text, self._reserved))
        if self._wrap:
            width = min(width, 480)
        return self._grow_room(QSize(width, self._height_at(width)))

    def minimumSizeHint(self) -> QSize:
        if self._wrap:
            return QSize(min(self.sizeHint().width(), 80), self.fontMetrics().lineSpacing())
        return self.sizeHint()

    def hasHeightForWidth(self) -> bool:
        return self._wrap

    def heightForWidth(self, width: int) -> int:
        if not self._wrap:
            return -1
        height = self._height_at(width)
        if len(self._answered) > 64:
            self._answered.clear()
        self._answered[width] = max(height, self._answered.get(width, 0))
        return height

    # ----- painting -----
    def paintEvent(self, event: QPaintEvent) -> None:
        rect = self.contentsRect()
        if not self._rich:
            painter = QPainter(self)
            painter.setPen(self.palette().color(self.foregroundRole()))
            painter.drawText(rect, self._plain_flags(), self._text)
            painter.end()
            return
        document = self._document
        document.setTextWidth(rect.width())
        top = rect.top()
        spare = rect.height() - document.size().height()
        if self._alignment & Qt.AlignmentFlag.AlignVCenter:
            top += max(0.0, spare / 2)
        elif self._alignment & Qt.AlignmentFlag.AlignBottom:
            top += max(0.0, spare)
        painter = QPainter(self)
        painter.translate(rect.left(), top)
        context = QAbstractTextDocumentLayout.PaintContext()
        context.palette.setColor(QPalette.ColorRole.Text, self.palette().color(self.foregroundRole()))
        document.documentLayout().draw(painter, context)
        painter.end()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (event.Type.FontChange, event.Type.StyleChange):
            self._set_up(self._document)  # the same document: a new one each zoom step grew memory without bound
            self._room = QSize(0, 0)
            self._sizes = {}
            self._answered = {}
            self.updateGeometry()

    # ----- room -----
    def _new_document(self) -> QTextDocument:
        document = QTextDocument(self)
        self._set_up(document)
        return document

    def _set_up(self, document: QTextDocument) -> None:
        document.setDocumentMargin(0)
        document.setDefaultFont(self.font())
        option = QTextOption(self._alignment & Qt.AlignmentFlag.AlignHorizontal_Mask)
        option.setWrapMode(QTextOption.WrapMode.WordWrap if self._wrap else QTextOption.WrapMode.NoWrap)
        document.setDefaultTextOption(option)
        self._fill(document, self._text)

    def _fill(self, document: QTextDocument, text: str) -> None:
        option = document.defaultTextOption()
        option.setAlignment(self._alignment & Qt.AlignmentFlag.AlignHorizontal_Mask)
        document.setDefaultTextOption(option)
        if self._rich:
            document.setHtml(text)
        else:
            document.setPlainText(text)

    def _plain_flags(self) -> int:
        flags = int(self._alignment.value if hasattr(self._alignment, "value") else self._alignment)
        return flags | (int(Qt.TextFlag.TextWordWrap.value) if self._wrap else 0)

    def _measure(self, text: str, width: int | None) -> QSize:
        known = self._sizes.get((text, width))
        if known is not None:
            return known
        if not self._rich:  # plain text: the font's metrics, much cheaper than a text document
            metrics = self.fontMetrics()
            bounds = QRect(0, 0, max(1, width) if width is not None else 1 << 20, 1 << 20)
            box = metrics.boundingRect(bounds, self._plain_flags() & ~int(Qt.AlignmentFlag.AlignVCenter.value
                                                                          | Qt.AlignmentFlag.AlignBottom.value), text)
            return QSize(box.width(), box.height())
        document = QTextDocument()
        document.setDocumentMargin(0)
        document.setDefaultFont(self.font())
        document.setDefaultTextOption(self._document.defaultTextOption())
        self._fill(document, text)
        if width is not None:
            document.setTextWidth(max(1, width))
        size = document.size()
        measured = QSize(int(size.width() + 0.999), int(size.height() + 0.999))
        if text in (self._reserved, self._text):
            self._sizes[(text, width)] = measured
        return measured

    def _ideal_width(self, text: str) -> int:
        margins = self.contentsMargins()
        return self._measure(text, None).width() + margins.left() + margins.right() if text else 0

    def _height_at(self, width: int) -> int:
        margins = self.contentsMargins()
        inner = width - margins.left() - margins.right() if self._wrap else None
        height = max(self._measure(t, inner).height() for t in (self._text, self._reserved or " "))
        return height + margins.top() + margins.bottom()

    def _grow_room(self, size: QSize) -> QSize:
        self._room = self._room.expandedTo(size)
        return QSize(self._room)

    def _needs_more_room(self) -> bool:
        """Whether the current text is wider (or, wrapped, taller) than the room the layout gave."""
        if self._wrap:  # a layout that already has our height for this width and gave less will not give more
            width = max(1, self.width())
            return self._height_at(width) > max(self.height(), self._answered.get(width, 0))
        return self._ideal_width(self._text) > max(self.width(), self._room.width())
