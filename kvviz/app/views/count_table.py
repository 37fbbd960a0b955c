"""The table both counters show: K/V computations with and without the cache, avoided, and the ratio,
per layer and over all layers. It shows the numbers a view gives it; it reads no records."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan

ROWS = ("with_cache", "without_cache", "avoided", "ratio")
ROW_TITLES = {"with_cache": "with cache", "without_cache": "without cache", "avoided": "avoided", "ratio": "ratio"}
# each row's colour, a Theme field
ROW_COLOURS = {"with_cache": "teal", "without_cache": "amber", "avoided": "foreground", "ratio": "foreground"}
DASH = "\u2013"
BOTTOM_RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom


def format_count(value: int) -> str:
    return f"{value:,}".replace(",", "\u2009")


def final_values(plan: RunPlan) -> dict[str, object]:
    """The numbers a counter shows at the end of `plan`'s run, in `CountTable.show_values`' form:
    the widest each row gets."""
    with_cache, without_cache = plan.final_with_cache, plan.final_without_cache
    values: dict[str, object] = {"with_cache": with_cache, "without_cache": without_cache,
                                 "avoided": without_cache - with_cache,
                                 "ratio": without_cache / with_cache if with_cache else 0.0}
    for key in ("with_cache", "without_cache", "avoided"):
        values[f"{key}_all_layers"] = int(values[key]) * plan.n_layer
    return values


class CountTable(QGridLayout):
    """Headers "per layer" and "all N layers", and a row per entry of ROWS. `labels[key]` holds a row's
    (name, per layer, all layers) labels."""

    def __init__(self, spacing: tuple[int, int], tooltip: str = "") -> None:
        super().__init__()
        self.setHorizontalSpacing(spacing[0])
        self.setVerticalSpacing(spacing[1])
        self.per_layer_header = QLabel("per layer")
        self.all_layers_header = QLabel("all layers")
        for col, header in ((1, self.per_layer_header), (2, self.all_layers_header)):
            header.setToolTip(tooltip)
            header.setObjectName("muted")
            header.setAlignment(Qt.AlignmentFlag.AlignRight)
            self.addWidget(header, 0, col)
        self.labels: dict[str, tuple[QLabel, LiveLabel, LiveLabel]] = {}
        self._reserved: dict[str, object] = {}
        for row, key in enumerate(ROWS, start=1):
            name = QLabel(ROW_TITLES[key])
            name.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom)
            per_layer, all_layers = LiveLabel(DASH, rich=False), LiveLabel(DASH, rich=False)
            per_layer.setAlignment(BOTTOM_RIGHT)  # a row's three texts on one baseline (see set_fonts)
            all_layers.setAlignment(BOTTOM_RIGHT)
            for col, label in enumerate((name, per_layer, all_layers)):
                self.addWidget(label, row, col)
            self.labels[key] = (name, per_layer, all_layers)

    def show_layers(self, n_layer: int, which: str = "") -> None:
        """Head the all-layers column: "all 6 layers", or of `which` layers ("all 4 computing layers")."""
        self.all_layers_header.setText(f"all {n_layer}{which} layers")

    def show_values(self, values: dict[str, object]) -> None:
        """`values` as the counters' `values()` give them: a row's per-layer number under its key, the
        all-layers one under `{key}_all_layers`, None where there is nothing to show yet."""
        for label, text in self._texts(values):
            label.setText(text)

    def reserve(self, values: dict[str, object]) -> None:
        """Keep each number's column as wide as `values` (a run's final counts, from its plan) need, so
        that the growing numbers of a run never change the table's width: a wider panel would relayout
        the splitter beside it and repaint its neighbours on every new digit."""
        self._reserved = dict(values)
        for label, text in self._texts(values):
            label.reserve(text)

    def _texts(self, values: dict[str, object]) -> list[tuple[LiveLabel, str]]:
        texts = []
        for key in ("with_cache", "without_cache", "avoided"):
            per_layer, all_layers = values.get(key), values.get(f"{key}_all_layers")
            texts.append((self.labels[key][1], DASH if per_layer is None else format_count(int(per_layer))))
            texts.append((self.labels[key][2], DASH if all_layers is None else format_count(int(all_layers))))
        ratio = values.get("ratio")
        text = DASH if ratio is None else f"{ratio:.2f}\u00d7"
        texts += [(self.labels["ratio"][1], text), (self.labels["ratio"][2], text)]
        return texts

    def clear(self) -> None:
        self.show_values({})

    def set_fonts(self, normal: QFont, big: QFont) -> None:
        """Headers, row names and all-layers numbers in `normal`, the per-layer numbers in `big`. A row's texts
        sit at its bottom, the `normal` ones raised by the difference of the fonts' descents: one baseline."""
        for label in (self.per_layer_header, self.all_layers_header):
            label.setFont(normal)
        raise_by = max(0, QFontMetrics(big).descent() - QFontMetrics(normal).descent())
        for name, per_layer, all_layers in self.labels.values():
            name.setFont(normal)
            per_layer.setFont(big)
            all_layers.setFont(normal)
            for label in (name, all_layers):
                label.setContentsMargins(0, 0, 0, raise_by)

    def set_theme(self, theme: Theme) -> None:
        for key, labels in self.labels.items():
            for label in labels:
                label.setStyleSheet(f"color: {getattr(theme, ROW_COLOURS[key])};")


@dataclass(frozen=True)
class CountFonts:
    """A count panel's text sizes in points at zoom 1: its notes, its numbers (bold), its heading (bold)."""

    normal: float
    big: float
    heading: float


class CountPanel(QFrame):
    """The framed panel both counters are: styled from the theme by its object name, its fonts sized by
    its `fonts` and the zoom, and tall enough for every line at its width (wrapped notes included), so that
    the splitter and the scroll area around the views keep the numbers whole instead of squeezing them.
    A subclass lays out its `heading`, `table` and `notes`, then calls `show_parts`."""

    fonts: CountFonts

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self._theme = themes.current()
        self._font_scale = 1.0
        self._dirty = False
        self.heading: QLabel | None = None
        self.table: CountTable | None = None
        self._notes: tuple[QLabel, ...] = ()

    def show_parts(self, heading: QLabel, table: CountTable, notes: tuple[QLabel, ...]) -> None:
        """Style and size the panel's parts, from now on in its theme and at its zoom."""
        self.heading, self.table, self._notes = heading, table, notes
        self._apply_theme()
        self._apply_fonts()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()

    def set_theme(self, theme: Theme) -> None:
        if theme != self._theme:
            self._theme = theme
            self._apply_theme()

    def panel_style(self, theme: Theme) -> str:
        name = self.objectName()
        return (f"QFrame#{name} {{ border: 1px solid {theme.border}; border-radius: 6px; "
                f"background: {theme.surface}; }} QFrame#{name} QLabel {{ background: transparent; border: none; }}"
                f" QFrame#{name} QLabel#muted {{ color: {theme.muted}; }}")

    def _apply_theme(self) -> None:
        self.setStyleSheet(self.panel_style(self._theme))
        self.table.set_theme(self._theme)

    def _apply_fonts(self) -> None:
        normal = QFont(self.font())
        normal.setPointSizeF(self.fonts.normal * self._font_scale)
        big = QFont(normal)
        big.setPointSizeF(self.fonts.big * self._font_scale)
        big.setBold(True)
        heading = QFont(normal)
        heading.setPointSizeF(self.fonts.heading * self._font_scale)
        heading.setBold(True)
        self.heading.setFont(heading)
        for label in self._notes:
            label.setFont(normal)
        self.table.set_fonts(normal, big)

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        layout = self.layout()
        return QSize(hint.width(), max(hint.height(), layout.totalHeightForWidth(max(self.width(), hint.width()))))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.updateGeometry()  # the wrapped notes need another height at another width
