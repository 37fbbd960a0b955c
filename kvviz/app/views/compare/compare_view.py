"""The whole view of compare mode: both runs of a lockstep, their grids aligned, their time and work, and
whether they chose the same tokens."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from kvviz.app.views.base import ViewGroup
from kvviz.app.views.compare.compare_counts import CompareCounts
from kvviz.app.views.compare.compare_time import CompareTimePlot
from kvviz.app.views.compare.divergence_banner import DivergenceBanner
from kvviz.app.views.compare.identity_strip import IdentityStrip
from kvviz.app.views.grid.kv_grid import KVGridView


class CompareView(ViewGroup, QWidget):
    """The divergence banner on top; the cached run's K/V grid over the uncached run's, column for
    column, with the time plot and the counts beside them; the identity strip at the bottom. Where the
    grids and the column beside them do not both fit (a narrow screen, a large zoom, the memory view beside),
    the column goes under the grids instead of the view scrolling sideways.

    Fed the primary run's plan and records (each token pass carrying its twin's), like RunView; a
    plan without a twin leaves every view in it empty.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("central")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # the theme's background fills the gaps
        self.banner = DivergenceBanner()
        self.cached_grid = KVGridView(lockstep="cached", legend=False)
        self.uncached_grid = KVGridView(lockstep="uncached")
        self.time_plot = CompareTimePlot()
        self.counts = CompareCounts()
        self.identity_strip = IdentityStrip()

        self.grid_splitter = QSplitter(Qt.Orientation.Vertical)  # one width for both: columns line up
        self.grid_splitter.setChildrenCollapsible(False)
        self.grid_splitter.addWidget(self.cached_grid)
        self.grid_splitter.addWidget(self.uncached_grid)
        self.side_splitter = QSplitter(Qt.Orientation.Vertical)
        self.side_splitter.setChildrenCollapsible(False)
        self.side_splitter.addWidget(self.time_plot)
        self.side_splitter.addWidget(self.counts)
        self.side_splitter.setStretchFactor(0, 3)
        self.side_splitter.setStretchFactor(1, 1)
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.main_splitter.setChildrenCollapsible(False)
        self.main_splitter.addWidget(self.grid_splitter)
        self.main_splitter.addWidget(self.side_splitter)
        self.main_splitter.setStretchFactor(0, 3)
        self.main_splitter.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.banner)
        layout.addWidget(self.main_splitter, 1)
        layout.addWidget(self.identity_strip)

    def set_font_scale(self, scale: float) -> None:
        super().set_font_scale(scale)
        if self.isVisible():  # else its first resize event decides, at the width it is shown at
            self._fit_orientation()

    def side_by_side(self) -> bool:
        """The time plot and the counts beside the grids (else under them, as wide as they are)."""
        return self.main_splitter.orientation() == Qt.Orientation.Horizontal

    def minimumSizeHint(self) -> QSize:
        """As narrow as the layout with the time plot and the counts under the grids: a narrow screen lays
        them out so (see _fit_orientation) rather than scroll sideways."""
        hint = super().minimumSizeHint()
        width = max(w.minimumSizeHint().width() for w in (self.grid_splitter, self.side_splitter, self.banner,
                                                           self.identity_strip))
        return QSize(width, hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_orientation()

    def _fit_orientation(self) -> None:
        grids, beside = self.grid_splitter.minimumSizeHint().width(), self.side_splitter.minimumSizeHint().width()
        side_by_side = self.width() >= grids + beside + self.main_splitter.handleWidth()
        if side_by_side != self.side_by_side():
            self.main_splitter.setOrientation(Qt.Orientation.Horizontal if side_by_side else Qt.Orientation.Vertical)
            self.updateGeometry()

    def views(self) -> tuple[DivergenceBanner, KVGridView, KVGridView, CompareTimePlot, CompareCounts, IdentityStrip]:
        """The views it holds, in redraw order; each follows views.base.RunViewProtocol."""
        return (self.banner, self.cached_grid, self.uncached_grid, self.time_plot, self.counts, self.identity_strip)
