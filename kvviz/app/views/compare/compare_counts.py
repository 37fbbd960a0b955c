"""Compare mode's counts: the K/V computations each run of a lockstep measured, what the cache avoided; against a
window or a quantized cache, where both runs compute the same, the bytes each cache holds instead."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from kvviz.app.views.count_table import DASH, CountFonts, CountPanel, CountTable, final_values, format_count
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan, StepRecord

LEAD_POINTS = 15.0  # the bytes held against a lossy cache: the figure the compare is about, as big as the counter's
BYTES_ROWS = ("full", "lossy", "ratio")  # the exact cache, the window or quantized one, how many times fewer


def bytes_ratio_text(full: int, lossy: int) -> str:
    """How many times fewer bytes the lossy cache holds than the exact one (or more, or the same)."""
    if lossy == full:
        return "the same"
    if lossy and lossy < full:
        return f"{full / lossy:.1f}\u00d7 fewer"
    return f"{lossy / full:.1f}\u00d7 more" if full else DASH


class CompareCounts(CountPanel):
    """Both runs' K/V computations, each measured in its own run (`kv_computed_total` of its latest
    pass, the cached run's filling pass included), per layer and over all layers, with the
    difference the cache avoided and the ratio.

    Against a window or a quantized cache both runs are cached and compute the same K/V (nothing is avoided):
    the panel then leads with what that compare is about, the bytes each cache holds (`cache_bytes` of each
    run's latest pass) and how many times fewer the lossy one holds, in big numbers; the computations go into a
    small line under them.

    A view (views.base.RunViewProtocol). `values()` returns what is shown. A plan without a twin
    leaves it empty.
    """

    fonts = CountFonts(normal=9.5, big=12.0, heading=10.5)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("compareCounts", parent)
        self._plan: RunPlan | None = None
        self._cached: StepRecord | None = None  # the cached run's latest pass
        self._uncached: StepRecord | None = None

        self.heading = QLabel("K/V computations, both measured")
        self.heading.setToolTip("One key and value row, for one layer and one token position; "
                                "each run counts the rows it really projected.")
        self.table = CountTable((14, 2))
        self.work_box = QWidget()  # the K/V table: hidden against a lossy cache, where both runs compute the same
        self.work_box.setLayout(self.table)
        self.table.setContentsMargins(0, 0, 0, 0)

        # against a lossy cache: the bytes each run's cache holds, measured, and how many times fewer
        self.bytes_heading = QLabel("Bytes the caches hold, both measured")
        self.bytes_heading.setToolTip("cache_bytes of each run's latest pass: keys and values as stored, "
                                      "scales included")
        self.bytes_box = QWidget()
        self.bytes_grid = QGridLayout(self.bytes_box)
        self.bytes_grid.setContentsMargins(0, 0, 0, 0)
        self.bytes_grid.setHorizontalSpacing(14)
        self.bytes_grid.setVerticalSpacing(2)
        self.bytes_labels: dict[str, tuple[QLabel, LiveLabel]] = {}
        for row, key in enumerate(BYTES_ROWS):
            name, value = QLabel(""), LiveLabel(DASH, rich=False)
            value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom)
            self.bytes_grid.addWidget(name, row, 0)
            self.bytes_grid.addWidget(value, row, 1)
            self.bytes_labels[key] = (name, value)
        self.work_note = LiveLabel("", rich=False, wrap=True)  # against a lossy cache: the computations, small
        self.work_note.setObjectName("muted")
        self.progress = LiveLabel("", rich=False, wrap=True)
        self.progress.setObjectName("muted")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(4)
        layout.addWidget(self.bytes_heading)
        layout.addWidget(self.bytes_box)
        layout.addWidget(self.heading)
        layout.addWidget(self.work_box)
        layout.addWidget(self.work_note)
        layout.addWidget(self.progress)
        layout.addStretch(1)
        self._show_lossy(False)
        self.show_parts(self.heading, self.table, (self.progress, self.work_note))

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan if plan.twin is not None else None
        for key, name in zip(("with_cache", "without_cache"), plan.lockstep_names, strict=True):
            self.table.labels[key][0].setText(name)
            self.bytes_labels["full" if key == "with_cache" else "lossy"][0].setText(name)
        self.bytes_labels["ratio"][0].setText(f"{plan.lockstep_names[1]} holds")
        lossy = self._plan is not None and plan.against_lossy
        self._show_lossy(lossy)
        if self._plan is not None:
            self.table.reserve(final_values(plan))
            self.progress.reserve(self._progress_text(plan, plan.budget))
        if lossy:  # the widest bytes: the exact cache's at the end of the run
            widest = f"{format_count(plan.cached_plan.final_cache_bytes)} bytes"
            self.bytes_labels["full"][1].reserve(widest)
            self.bytes_labels["lossy"][1].reserve(widest)
            self.bytes_labels["ratio"][1].reserve("00.0\u00d7 fewer")
            self.work_note.reserve(self._work_text(plan, plan.final_with_cache, plan.n_layer))
        self._cached = self._uncached = None
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        if self._plan is None:
            return
        for record in records:
            cached, uncached = record.lockstep_passes()
            if cached:
                self._cached = cached[-1]
                self._dirty = True
            if uncached:
                self._uncached = uncached[-1]
                self._dirty = True

    def values(self) -> dict[str, object]:
        """The shown numbers, per layer (None where a run has no pass yet) and over all layers; against a lossy
        cache also `bytes_held` (exact, lossy) and `bytes_ratio` (exact over lossy), else None."""
        cached = self._cached.kv_computed_total if self._cached is not None else None
        uncached = self._uncached.kv_computed_total if self._uncached is not None else None
        n_layer = self._plan.n_layer if self._plan is not None else None
        both = cached is not None and uncached is not None
        avoided = uncached - cached if both else None
        lossy = both and self._plan is not None and self._plan.against_lossy
        held = (self._cached.cache_bytes, self._uncached.cache_bytes) if lossy else None
        return {
            "with_cache": cached,
            "without_cache": uncached,
            "avoided": avoided,
            "ratio": uncached / cached if both and cached else None,
            "n_layer": n_layer,
            "with_cache_all_layers": cached * n_layer if cached is not None else None,
            "without_cache_all_layers": uncached * n_layer if uncached is not None else None,
            "avoided_all_layers": avoided * n_layer if avoided is not None else None,
            "bytes_held": held,
            "bytes_ratio": held[0] / held[1] if held is not None and held[1] else None,
        }

    def against_lossy(self) -> bool:
        """Whether the panel leads with the bytes held (a compare against a window or a quantized cache)."""
        return not self.bytes_box.isHidden()

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        plan = self._plan
        if plan is None:
            self.table.clear()
            self.progress.setText("no compare run")
            return
        self.table.show_layers(plan.n_layer)
        values = self.values()
        self.table.show_values(values)
        steps = max((r.new_tokens for r in (self._cached, self._uncached) if r is not None), default=0)
        text = self._progress_text(plan, steps)
        if plan.against_lossy:
            self._show_bytes(values)
            if self._cached is not None and self._uncached is not None:
                first, second = plan.lockstep_names
                text += (f"; positions held: {self._cached.positions_held} ({first}), "
                         f"{self._uncached.positions_held} ({second})")
        self.progress.setText(text)

    # ----- against a lossy cache -----
    def _show_lossy(self, lossy: bool) -> None:
        """Lead with the bytes held (`lossy`), the K/V computations in a small line; else the K/V table."""
        for widget in (self.bytes_heading, self.bytes_box, self.work_note):
            widget.setVisible(lossy)
        for widget in (self.heading, self.work_box):
            widget.setVisible(not lossy)

    def _show_bytes(self, values: dict[str, object]) -> None:
        held = values["bytes_held"]
        if held is None:
            for _name, value in self.bytes_labels.values():
                value.setText(DASH)
            self.work_note.setText("")
            return
        full, lossy = held
        self.bytes_labels["full"][1].setText(f"{format_count(full)} bytes")
        self.bytes_labels["lossy"][1].setText(f"{format_count(lossy)} bytes")
        self.bytes_labels["ratio"][1].setText(bytes_ratio_text(full, lossy))
        self.work_note.setText(self._work_text(self._plan, int(values["with_cache"]), int(values["n_layer"]),
                                               int(values["without_cache"])))

    @staticmethod
    def _work_text(plan: RunPlan, full: int, n_layer: int, lossy: int | None = None) -> str:
        """The K/V computations of both cached runs, in a line: each computes every position once."""
        first, second = plan.lockstep_names
        lossy = full if lossy is None else lossy
        counts = (f"{format_count(full)} per layer in each run" if full == lossy else
                  f"{format_count(full)} ({first}) and {format_count(lossy)} ({second}) per layer")
        return (f"K/V computations: {counts}, all {n_layer} layers {format_count(full * n_layer)}; "
                "both runs keep a cache, so neither avoids more")

    def _apply_theme(self) -> None:
        super()._apply_theme()
        theme = self._theme
        for key, colour in (("full", theme.teal), ("lossy", theme.amber), ("ratio", theme.foreground)):
            for label in self.bytes_labels[key]:
                label.setStyleSheet(f"color: {colour};")

    def _apply_fonts(self) -> None:
        super()._apply_fonts()
        self.bytes_heading.setFont(self.heading.font())
        normal = QFont(self.font())
        normal.setPointSizeF(self.fonts.normal * self._font_scale)
        lead = QFont(normal)
        lead.setPointSizeF(LEAD_POINTS * self._font_scale)
        lead.setBold(True)
        for name, value in self.bytes_labels.values():
            name.setFont(normal)
            value.setFont(lead)

    @staticmethod
    def _progress_text(plan: RunPlan, steps: int) -> str:
        return f"P = {plan.prompt_tokens}, N = {steps} of {plan.budget} tokens; each run counts what it projected"
