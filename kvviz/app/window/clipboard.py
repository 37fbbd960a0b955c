"""Views copied to the clipboard as images: Ctrl+Shift+C copies the chart (in compare mode the whole compare
view, the picture that tells that story), and the right-click menu of the grid, the chart and compare mode's
grids and time plot offers "Copy image".

The image is rendered as the PNG export renders it (`export.render.render_png`: the theme's background,
sharp cells, curves drawn for the size), without a caption, at the view's size times the screen's device
pixel ratio. The views switch pyqtgraph's own plot menu off (its zoom and axis entries have no use here),
so the menu here is the plot widget's context menu: "Copy image", and "Export view..." for a view that
offers it (`export_requested`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QPoint, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QGraphicsView, QMainWindow, QMenu, QWidget

if TYPE_CHECKING:
    from kvviz.app.window.workspace import Workspace

COPY_TEXT = "Copy image"
STATUS_MS = 4000


def view_image(view: QWidget) -> QImage:
    """`view` as the PNG export draws it, without a caption, at its size times the device pixel ratio."""
    from kvviz.app.export.render import render_png

    width = max(1, round(view.width() * view.devicePixelRatioF()))
    return render_png(view, width)


class ImageCopier(QObject):
    """Copies the window's views to the clipboard, from Ctrl+Shift+C (`copy_chart`) and from each plot's
    context menu; says what it copied in the status bar."""

    def __init__(self, window: QMainWindow, workspace: Workspace) -> None:
        super().__init__(window)
        self._window = window  # its status bar says what was copied; the menus are its children
        self._workspace = workspace
        self.menu: QMenu | None = None  # the context menu last shown
        self.add_context_menus((workspace.run_view.grid, workspace.run_view.chart))
        workspace.panel_built.connect(self._on_panel_built)

    def add_context_menus(self, views: Sequence[QWidget]) -> None:
        """ "Copy image" and "Export..." on the plots of `views` (compare mode's join when it is built)."""
        for view in views:
            for plot in view.findChildren(QGraphicsView):
                plot.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
                plot.customContextMenuRequested.connect(
                    lambda pos, view=view, plot=plot: self._show_menu(view, plot, pos))

    def _on_panel_built(self, panel: QWidget) -> None:
        from kvviz.app.views.compare.compare_view import CompareView

        if isinstance(panel, CompareView):
            self.add_context_menus((panel.cached_grid, panel.uncached_grid, panel.time_plot))

    def chart(self) -> QWidget:
        """What Ctrl+Shift+C copies: the chart, or in compare mode the compare view."""
        return self._workspace.compare_view if self._workspace.comparing else self._workspace.run_view.chart

    def copy_chart(self) -> QImage | None:
        return self.copy(self.chart())

    def copy(self, view: QWidget) -> QImage | None:
        """Put `view`'s image on the clipboard and return it; None (and a word in the status bar) when the
        view is not shown."""
        bar = self._window.statusBar()
        if not view.isVisible() or view.width() <= 0 or view.height() <= 0:
            bar.showMessage("Nothing to copy: the view is not shown.", STATUS_MS)
            return None
        image = view_image(view)
        QApplication.clipboard().setImage(image)
        bar.showMessage(f"Copied an image of {image.width()} \u00d7 {image.height()} pixels.", STATUS_MS)
        return image

    def context_menu(self, view: QWidget) -> QMenu:
        """The menu a right-click on `view`'s plot shows."""
        menu = QMenu(self._window)
        menu.addAction(COPY_TEXT, lambda: self.copy(view))
        export = getattr(view, "export_requested", None)
        if export is not None:
            menu.addAction("Export view\u2026", export.emit)
        return menu

    def _show_menu(self, view: QWidget, plot: QGraphicsView, pos: QPoint) -> None:
        if self.menu is not None:
            self.menu.deleteLater()  # the one shown before, closed by now
        self.menu = self.context_menu(view)
        self.menu.popup(plot.viewport().mapToGlobal(pos))
