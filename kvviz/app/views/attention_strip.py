"""The attention view's strip, drawn: its plot, the shades of its weights, and the outline of the chosen head."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QGraphicsRectItem

from kvviz.app.theme import Theme
from kvviz.app.views.base import cache_axes, cell_plot
from kvviz.app.views.strip_image import strip_image

_SHADES: dict[tuple[str, int], np.ndarray] = {}


def shade_table(theme: Theme, steps: int = 256) -> np.ndarray:
    """(steps, 4) RGBA colours from weight 0 to the strip's largest weight: matplotlib's perceptual "inferno"
    ramp, its dark end at 0 on a dark background and its pale end at 0 on a light one. The heaviest weight
    stands out from the background by 16:1 (dark theme) or 20:1 (light), half of it from the heaviest by more
    than 2.5:1, and hue as well as lightness tells the weights apart."""
    key = (theme.background, steps)
    if key not in _SHADES:
        t = np.linspace(0.0, 1.0, steps) ** 0.75  # small weights stay visible
        light = QColor(theme.background).lightnessF() > 0.5
        positions = 0.97 - 0.92 * t if light else 0.22 + 0.78 * t
        _SHADES[key] = pg.colormap.get("inferno").map(positions, mode="byte").astype(np.uint8)
    return _SHADES[key]


def strip_plot(min_height: int) -> tuple[pg.PlotWidget, pg.PlotItem, pg.ImageItem, QGraphicsRectItem]:
    """A cell plot of heads × positions, "head" on its left axis and no values on its bottom one, with a hidden
    outline for one head's row."""
    plot_widget, plot_item, image_item = cell_plot(min_height)
    head_outline = QGraphicsRectItem()
    head_outline.setZValue(10)
    head_outline.hide()
    plot_item.addItem(head_outline)
    plot_item.setLabel("left", "head")
    plot_item.getAxis("bottom").setStyle(showValues=False)
    cache_axes(plot_item)
    return plot_widget, plot_item, image_item, head_outline


def draw_strip(plot_item: pg.PlotItem, image_item: pg.ImageItem, strip: np.ndarray, brightest: float,
               theme: Theme, group: int = 1, evicted: np.ndarray | None = None) -> None:
    """`strip`'s (heads, width) weights in shades from 0 to `brightest` (NaN: empty), a row a head, the plot's
    height; the `evicted` positions (an importance method's) in the K/V grid's evicted colour, striped."""
    heads, width = strip.shape
    empty = np.array(QColor(theme.empty).getRgb(), dtype=np.uint8)
    gap = np.array(QColor(theme.grid_line).getRgb(), dtype=np.uint8)
    image = strip_image(strip, brightest, shade_table(theme), empty, gap, group, evicted,
                        np.array(QColor(theme.evicted).getRgb(), dtype=np.uint8))
    image_item.setImage(image, autoLevels=False, levels=(0, 255))
    image_item.setRect(QRectF(0, 0, width, heads))
    plot_item.getViewBox().setYRange(0, heads, padding=0)


def outline_head(outline: QGraphicsRectItem, head: int, shape: tuple[int, int], theme: Theme) -> None:
    """Frame `head`'s row of a strip of `shape` (heads, width), or hide the frame where the strip has no such head
    (all heads shown)."""
    heads, width = shape
    if not 0 <= head < heads:
        outline.hide()
        return
    outline.setRect(QRectF(0, head, width, 1))
    pen = pg.mkPen(theme.frame, width=2)
    pen.setCosmetic(True)
    outline.setPen(pen)
    outline.show()


def align_columns(plot_item: pg.PlotItem, grid_item: pg.PlotItem) -> None:
    """Line `plot_item`'s columns up under `grid_item`'s: the same x range, and a left axis as wide as the
    grid's, whatever it is."""
    plot_item.setXLink(grid_item)
    grid_axis, own_axis = grid_item.getAxis("left"), plot_item.getAxis("left")

    def follow() -> None:
        if own_axis.width() != grid_axis.width():
            own_axis.setWidth(grid_axis.width())

    grid_axis.geometryChanged.connect(follow)
    follow()
