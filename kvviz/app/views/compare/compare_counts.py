"""Compare mode's counts: the K/V computations each run of a lockstep measured, what the cache avoided."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from kvviz.app.views.count_table import CountFonts, CountPanel, CountTable, final_values
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan, StepRecord


class CompareCounts(CountPanel):
    """Both runs' K/V computations, each measured in its own run (`kv_computed_total` of its latest
    pass, the cached run's filling pass included), per layer and over all layers, with the
    difference the cache avoided and the ratio.

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
        self.progress = LiveLabel("", rich=False, wrap=True)
        self.progress.setObjectName("muted")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(4)
        layout.addWidget(self.heading)
        layout.addLayout(self.table)
        layout.addWidget(self.progress)
        layout.addStretch(1)
        self.show_parts(self.heading, self.table, (self.progress,))

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan if plan.twin is not None else None
        for key, name in zip(("with_cache", "without_cache"), plan.lockstep_names, strict=True):
            self.table.labels[key][0].setText(name)
        if self._plan is not None:
            self.table.reserve(final_values(plan))
            self.progress.reserve(self._progress_text(plan, plan.budget))
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
        """The shown numbers, per layer (None where a run has no pass yet) and over all layers."""
        cached = self._cached.kv_computed_total if self._cached is not None else None
        uncached = self._uncached.kv_computed_total if self._uncached is not None else None
        n_layer = self._plan.n_layer if self._plan is not None else None
        both = cached is not None and uncached is not None
        avoided = uncached - cached if both else None
        return {
            "with_cache": cached,
            "without_cache": uncached,
            "avoided": avoided,
            "ratio": uncached / cached if both and cached else None,
            "n_layer": n_layer,
            "with_cache_all_layers": cached * n_layer if cached is not None else None,
            "without_cache_all_layers": uncached * n_layer if uncached is not None else None,
            "avoided_all_layers": avoided * n_layer if avoided is not None else None,
        }

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
        self.table.show_values(self.values())
        steps = max((r.new_tokens for r in (self._cached, self._uncached) if r is not None), default=0)
        text = self._progress_text(plan, steps)
        if plan.against_lossy and self._cached is not None and self._uncached is not None:
            first, second = plan.lockstep_names
            full, lossy = self._cached.cache_bytes, self._uncached.cache_bytes
            text += (f"; positions held: {self._cached.positions_held} ({first}), "
                     f"{self._uncached.positions_held} ({second}); bytes held: {full:,} and {lossy:,}"
                     + (f", {full / lossy:.1f}× less" if lossy and full > lossy else ""))
        self.progress.setText(text)

    @staticmethod
    def _progress_text(plan: RunPlan, steps: int) -> str:
        return f"P = {plan.prompt_tokens}, N = {steps} of {plan.budget} tokens; each run counts what it projected"
