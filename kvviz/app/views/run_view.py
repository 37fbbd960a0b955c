"""The whole view of a run: token strip over the K/V grid, chart and counter below."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from kvviz.app.views.attention_view import AttentionView
from kvviz.app.views.base import ViewGroup
from kvviz.app.views.counter import CounterPanel
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.token_strip import TokenStrip
from kvviz.app.views.work_chart import WorkChart

CHART_LEAST_WIDTH = 460  # pixels at zoom 1: the work plot with its axis and its title (centred over the plot) whole


class RunView(ViewGroup, QWidget):
    """Everything a viewer looks at, laid out once for the main window and for `kvviz export`: the token strip,
    the K/V grid, the attention strip when it is open, and the chart with the counter beside it, or under it
    where the view is too narrow for both (the memory view beside it on a 1024-pixel screen)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("central")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # the theme's background between panels
        self.token_strip = TokenStrip()
        self.grid = KVGridView()
        self.chart = WorkChart()
        self.chart.setMinimumWidth(CHART_LEAST_WIDTH)
        self.counter = CounterPanel()
        self.bottom_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.bottom_splitter.setChildrenCollapsible(False)  # no panel shrinks below what it needs to be read
        self.bottom_splitter.addWidget(self.chart)
        self.bottom_splitter.addWidget(self.counter)
        self.bottom_splitter.setStretchFactor(0, 3)
        self.bottom_splitter.setStretchFactor(1, 1)
        self.main_splitter = QSplitter(Qt.Orientation.Vertical)
        self.main_splitter.setChildrenCollapsible(False)
        self.attention = AttentionView()  # View > Attention: under the grid, its columns under the grid's
        self.attention.hide()
        self.attention.align_under(self.grid.plot_item)
        self.grid.layer_clicked.connect(self.attention.set_layer)
        self.attention.layer_shown.connect(self.grid.set_selected_layer)
        self.main_splitter.addWidget(self.grid)
        self.main_splitter.addWidget(self.attention)
        self.main_splitter.addWidget(self.bottom_splitter)
        self.main_splitter.setStretchFactor(0, 3)
        self.main_splitter.setStretchFactor(1, 2)
        self.main_splitter.setStretchFactor(2, 2)
        self._grid_share = 0.5  # of the grid and the chart's room, the grid's share while the attention view is hidden
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.token_strip)
        layout.addWidget(self.main_splitter, 1)

    def show_attention(self, on: bool) -> None:
        """Show or hide the attention view under the grid. Shown, it takes a quarter of the room (at least its
        own least height) from the grid and the chart, in proportion; hidden, it gives its room back to both, in
        the proportion they had before it was shown, so the grid gets back what it gave."""
        if on == self.attention.isVisibleTo(self):
            return
        grid, attention, bottom = self.main_splitter.sizes()
        if on and grid + bottom > 0:
            self._grid_share = grid / (grid + bottom)
        self.attention.setVisible(on)
        total = grid + attention + bottom
        if total <= 0:  # not laid out yet: the splitter shares the room by its stretch factors
            return
        shown = max(total // 4, _least_height(self.attention)) if on else 0
        rest = total - shown
        least_grid, least_bottom = _least_height(self.grid), _least_height(self.bottom_splitter)
        grid = max(least_grid, min(round(rest * self._grid_share), rest - least_bottom))
        # where the room is short, each panel gets its least height and the panels scroll by as little as can be
        self.main_splitter.setSizes([grid, shown, max(least_bottom, rest - grid)])

    def set_font_scale(self, scale: float) -> None:
        super().set_font_scale(scale)
        self.chart.setMinimumWidth(int(CHART_LEAST_WIDTH * scale))
        if self.isVisible():  # else its first resize event decides, at the width it is shown at
            self._fit_bottom()

    def minimumSizeHint(self) -> QSize:
        """As narrow as the layout with the counter under the chart (see _fit_bottom)."""
        hint = super().minimumSizeHint()
        parts = (self.token_strip, self.grid, self.attention, self.chart, self.counter)
        width = max(max(w.minimumSizeHint().width(), w.minimumWidth()) for w in parts if not w.isHidden())
        return QSize(width, hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        # after the layout pass that resized this view: changing the splitter's orientation inside it re-entered
        # QBoxLayout.setGeometry with items it was still placing (a segmentation fault)
        QTimer.singleShot(0, self, self._fit_bottom)

    def _fit_bottom(self) -> None:
        """The counter beside the chart when both fit at their least widths, else under it."""
        least = sum(max(w.minimumSizeHint().width(), w.minimumWidth()) for w in (self.chart, self.counter))
        beside = self.width() >= least + self.bottom_splitter.handleWidth()
        orientation = Qt.Orientation.Horizontal if beside else Qt.Orientation.Vertical
        if orientation != self.bottom_splitter.orientation():
            self.bottom_splitter.setOrientation(orientation)
            self.main_splitter.refresh()  # the bottom's new least height now, not a pass of the event loop later
            self.updateGeometry()

    def views(self) -> tuple[TokenStrip, KVGridView, WorkChart, CounterPanel]:
        """The views it holds, in redraw order; each follows views.base.RunViewProtocol."""
        return (self.token_strip, self.grid, self.chart, self.counter)


def _least_height(widget: QWidget) -> int:
    """The least height a splitter gives `widget` (as QSplitter reads it)."""
    return max(widget.minimumSizeHint().height(), widget.minimumHeight())
