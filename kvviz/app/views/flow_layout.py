"""A layout that places widgets left to right and wraps them onto the next line when the width runs out."""

from __future__ import annotations

import shiboken6
from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget


class FlowLayout(QLayout):
    """Qt's flow layout example: items keep their size hints and wrap like words; hidden items take no room.

    Used for the run controls, so that a narrow window (a 1024-pixel projector, a large zoom) puts
    the settings on a second line instead of growing past the screen.
    """

    def __init__(self, parent: QWidget | None = None, spacing: int = 8) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._widgets: dict[int, QWidget | None] = {}  # id(item) -> its widget, as Python holds it
        self.setSpacing(spacing)
        self.setContentsMargins(QMargins(0, 0, 0, 0))

    def addItem(self, item: QLayoutItem) -> None:  # Qt's name
        self._items.append(item)
        widget = item.widget()
        self._widgets[id(item)] = widget  # the layout reads the widgets, never the items Qt may free under it

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        if not 0 <= index < len(self._items):
            return None
        item = self._items.pop(index)
        self._widgets.pop(id(item), None)
        return item

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        try:
            return self._arrange(QRect(0, 0, width, 0), move=False)
        except RuntimeError:  # an item deleted under the query: the window is being torn down
            return 0

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        try:
            self._arrange(rect, move=True)
        except RuntimeError:  # as in heightForWidth
            pass

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        size = QSize()
        for widget in self._visible():
            size = size.expandedTo(_least(widget))
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _visible(self) -> list[QWidget]:
        """The shown widgets, in order. While the window is torn down Qt may free an item (or its widget) before
        a last layout query reaches this layout: a widget gone is skipped, an item is never touched."""
        widgets = (self._widgets.get(id(item)) for item in self._items)
        return [w for w in widgets if w is not None and shiboken6.isValid(w) and not w.isHidden()]

    def _arrange(self, rect: QRect, move: bool) -> int:
        margins = self.contentsMargins()
        area = rect.adjusted(margins.left(), margins.top(), -margins.right(), -margins.bottom())
        x, y, line_height = area.x(), area.y(), 0
        spacing = self.spacing()
        line: list[tuple[QWidget, QSize]] = []

        def place_line() -> None:
            for widget, size in line:  # centred vertically in their line
                top = line_y + (line_height - size.height()) // 2
                widget.setGeometry(QRect(QPoint(item_x[id(widget)], top), size))

        item_x: dict[int, int] = {}
        line_y = y
        for item in self._visible():
            size = item.sizeHint().boundedTo(QSize(area.width(), 1 << 16)).expandedTo(_least(item))
            if line and x + size.width() > area.right() + 1:
                if move:
                    place_line()
                x, y = area.x(), y + line_height + spacing
                line_y, line_height, line = y, 0, []
            item_x[id(item)] = x
            line.append((item, size))
            x += size.width() + spacing
            line_height = max(line_height, size.height())
        if move:
            place_line()
        return y + line_height - rect.y() + margins.bottom()


def _least(widget: QWidget) -> QSize:
    """The least size a layout gives `widget`, as QWidgetItem.minimumSize reckons it."""
    hint = widget.minimumSizeHint()
    least = widget.minimumSize()
    return QSize(least.width() or max(hint.width(), 0), least.height() or max(hint.height(), 0))
