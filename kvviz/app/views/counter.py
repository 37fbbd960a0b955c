"""The live counter: K/V computations with and without cache, avoided, and the ratio."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from kvviz.app.views.count_table import ROW_TITLES, CountFonts, CountPanel, CountTable, final_values
from kvviz.app.views.live_label import LiveLabel
from kvviz.app.views.speculation_rows import SpeculationRows, speculation_values
from kvviz.core.records import RunPlan, StepRecord

STOP_REASONS = {  # short: the progress line keeps the room it had (the banner explains a full context)
    "max_new_tokens": "done",
    "context_full": "context full ({n_ctx} positions)",
}


# the counter's heading: a cache of K and V, or latent attention's (the latent is what a pass computes or reuses)
HEADINGS = {False: "K/V computations", True: "Latent computations"}
LATENT_UNIT = ("Latent attention: one latent and RoPE key, for one layer and one token position; every pass "
               "rebuilds each head's K and V from the cached latents.")


class CounterPanel(CountPanel):
    """K/V computations in the lab's unit (per layer, per token position), all-layers total beside.

    A view (views.base.RunViewProtocol): `reset(plan)`, `apply(records)`, `refresh()`.
    The numbers are the record's measured totals, the same as `kvviz count` gives for P and N.
    `values()` returns what is shown. A speculative run adds its rounds' totals (`speculation`, from the
    latest record's `speculation`): drafted, accepted, rolled back, the acceptance rate, tokens a target pass.
    """

    fonts = CountFonts(normal=10.0, big=15.0, heading=12.0)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("counter", parent)
        self._plan: RunPlan | None = None
        self._record: StepRecord | None = None

        self.heading = QLabel(HEADINGS[False])
        unit = "The unit of the lab: one key and value row, for one layer and one token position."
        self.heading.setToolTip(unit)
        self.table = CountTable((18, 4), unit)
        self.measured_note = QLabel("")
        self.measured_note.setObjectName("muted")
        self.measured_note.setWordWrap(True)
        self.progress = LiveLabel("", rich=False, wrap=True)
        self.progress.setObjectName("muted")
        self.window_note = QLabel("")  # a cache with a window: what it holds and what it evicted, measured
        self.window_note.setWordWrap(True)
        self.window_note.hide()
        self.latent_note = QLabel("")  # latent attention: the numbers it caches against multi-head attention's
        self.latent_note.setWordWrap(True)
        self.latent_note.hide()
        self.layers_note = QLabel("")  # a model whose layers differ: the bytes each kind of layer holds, measured
        self.layers_note.setWordWrap(True)
        self.layers_note.hide()
        self.speculation = SpeculationRows()  # a speculative run's drafts: hidden for a plain run
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(6)
        layout.addWidget(self.heading)
        layout.addLayout(self.table)
        layout.addWidget(self.measured_note)
        layout.addWidget(self.window_note)
        layout.addWidget(self.latent_note)
        layout.addWidget(self.layers_note)
        layout.addWidget(self.speculation)
        layout.addWidget(self.progress)
        layout.addStretch(1)
        self.show_parts(self.heading, self.table, (self.measured_note, self.window_note, self.latent_note,
                                                          self.layers_note, self.progress,
                                                          *self.speculation.all_labels()))

    def reset(self, plan: RunPlan) -> None:
        self._plan = plan
        self._record = None
        self.table.reserve(final_values(plan))
        # the longest text of the run, its end included: a new text never asks the window for more room
        self.progress.reserve(self._progress_text(plan, plan.budget, plan.passes, True, plan.stop_reason))
        self.speculation.reset(plan)
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        if records:
            self._record = records[-1]
            self._dirty = True

    def values(self) -> dict[str, object]:
        """The shown numbers: per layer, all layers (None before the first step)."""
        rec, plan = self._record, self._plan
        # a speculative run: its drafts' totals too (None before its first round)
        speculative = speculation_values(rec) if plan is not None and plan.drafter is not None else {}
        if rec is None or plan is None:
            return {**{key: None for key in ("with_cache", "without_cache", "avoided", "ratio", "n_layer")},
                    **speculative}
        return {
            "with_cache": rec.with_cache_total,
            "without_cache": rec.without_cache_total,
            "avoided": rec.avoided_total,
            "ratio": rec.without_cache_total / rec.with_cache_total if rec.with_cache_total else 0.0,
            "n_layer": rec.n_layer,
            "with_cache_all_layers": rec.with_cache_total * self._computing(plan),
            "without_cache_all_layers": rec.without_cache_total * self._computing(plan),
            "avoided_all_layers": rec.avoided_total * self._computing(plan),
            "new_tokens": rec.new_tokens,
            "stop_reason": rec.stop_reason,
            **speculative,
        }

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        plan, rec = self._plan, self._record
        if plan is None:
            return
        computing = self._computing(plan)
        self.table.show_layers(computing, "" if computing == plan.n_layer else " computing")
        latent = bool(plan.cache_parts)
        self.heading.setText(HEADINGS[latent])
        self.heading.setToolTip(LATENT_UNIT if latent else self.table.per_layer_header.toolTip())
        self.window_note.setVisible(plan.policy.evicts and plan.use_cache)
        self.window_note.setText(self._window_text(plan, rec))
        self.latent_note.setVisible(plan.multi_head_numbers > 0)
        self.latent_note.setText(self.latent_text(plan))
        # (an importance method's layers are alike but for PyramidKV's budgets: the window note says what they hold)
        self.layers_note.setVisible(bool(plan.layer_shapes) and plan.use_cache and not plan.policy.importance)
        self.layers_note.setText(self.layers_text(plan, rec))
        measured = "with_cache" if plan.use_cache else "without_cache"
        counted = "without_cache" if measured == "with_cache" else "with_cache"
        # short, so that the counter leaves a 720p screen room for a 48-layer grid and the attention strip
        self.measured_note.setText(f"measured: {ROW_TITLES[measured]}; counted: {ROW_TITLES[counted]}")
        self.measured_note.setToolTip(f"Measured in this run: {ROW_TITLES[measured]}; {ROW_TITLES[counted]} is "
                                      f"counted for the same text")
        if plan.drafter is not None:
            self.speculation.show_values(speculation_values(rec))
        if rec is None:
            self.table.clear()
            self.progress.setText(f"P = {plan.prompt_tokens} prompt, N = 0 of {plan.budget} new tokens")
            return
        self.table.show_values(self.values())
        stop_reason = rec.stop_reason if rec.final else None
        self.progress.setText(self._progress_text(plan, rec.new_tokens, rec.step + 1, rec.token_id is None,
                                                  stop_reason))

    def _apply_theme(self) -> None:
        super()._apply_theme()
        self.speculation.set_theme(self._theme)

    def _apply_fonts(self) -> None:
        super()._apply_fonts()
        self.speculation.set_font(self.progress.font())

    @staticmethod
    def latent_text(plan: RunPlan) -> str:
        """Latent attention (MLA): the numbers its cache keeps a layer and position against what multi-head
        attention with the same heads would keep (each head's key and value), and a position's bytes, from the
        family's sizes as the plan records them; "" for a cache of heads."""
        multi_head = plan.multi_head_numbers
        if not multi_head:
            return ""
        latent = sum(numbers for _, numbers in plan.cache_parts)
        parts = " + ".join(f"{numbers} {name.split()[0]}" for name, numbers in plan.cache_parts)
        key, value = plan.head_key_value
        text = (f"latent cache: {parts} = {latent:,} numbers a layer and position; multi-head attention with its "
                f"{plan.n_head} heads: {plan.n_head} \u00d7 ({key} + {value}) = {multi_head:,}, "
                f"{multi_head / latent:.1f}\u00d7 more")
        if plan.use_cache and plan.cache_bytes_per_position:
            text += (f". A position, {plan.n_layer} layers: {plan.cache_bytes_per_position:,} bytes against "
                     f"{multi_head * plan.dtype_bytes * plan.n_layer:,}")
        return text

    @staticmethod
    def _computing(plan: RunPlan) -> int:
        """Layers that compute keys and values: all but the shared ones, which read an earlier layer's."""
        return plan.n_layer - sum(shape.kind == "shared" for shape in plan.layer_shapes)

    @staticmethod
    def layers_text(plan: RunPlan, rec: StepRecord | None) -> str:
        """A model whose layers differ: the bytes its cache holds, layer by layer, summed by what the layers keep,
        as the record measured them: "cache 6,144 bytes: 4 window layers 2,048, 2 full layers 4,096, 2 shared 0";
        "" for a model whose layers are alike, or a run without a cache."""
        if not plan.layer_shapes or not plan.use_cache:
            return ""
        names = {"full": "full", "window": "window", "shared": "shared", "state": "state (fixed)",
                 "importance": plan.policy.method_name}
        sizes = rec.layer_bytes if rec is not None and rec.layer_bytes else (0,) * plan.n_layer
        totals: dict[str, tuple[int, int]] = {}  # kind -> (layers, bytes)
        for shape, size in zip(plan.layer_shapes, sizes, strict=True):
            layers, total = totals.get(shape.kind, (0, 0))
            totals[shape.kind] = (layers + 1, total + size)
        parts = ", ".join(f"{layers} {names[kind]} layer{'s' * (layers != 1)} {total:,}"
                          for kind, (layers, total) in totals.items())
        return f"cache {sum(sizes):,} bytes by layer: {parts}"

    @staticmethod
    def _window_text(plan: RunPlan, rec: StepRecord | None) -> str:
        """What a cache with a window holds and has evicted so far, per layer, as the records measured it."""
        if not plan.policy.evicts or not plan.use_cache:
            return ""
        keeps = f"the cache keeps {plan.policy.describe()}"
        if rec is None:
            return keeps
        if rec.eviction is not None:  # an importance method's: what each layer holds and dropped, measured
            return f"{keeps}: {importance_text(rec)}"
        end = rec.speculation.rolled_back[0] if rec.speculation is not None else rec.fed_stop  # (drafts rolled back)
        evicted = end - rec.positions_held
        windowed = rec.n_layer - min(plan.policy.first_layer, rec.n_layer)
        if windowed < rec.n_layer:  # a window on the upper layers only (Qwen2's max_window_layers)
            return (f"{keeps}: a windowed layer holds {rec.positions_held} positions; K/V evicted: {evicted} per "
                    f"windowed layer ({evicted * windowed} in its {windowed} windowed layers)")
        return (f"{keeps}: it holds {rec.positions_held} positions; K/V evicted: {evicted} per layer "
                f"({evicted * rec.n_layer} in all {rec.n_layer} layers)")

    @staticmethod
    def _progress_text(plan: RunPlan, new_tokens: int, step: int, cache_fill: bool,
                       stop_reason: str | None = None) -> str:
        """The run's progress; at its end (`stop_reason` given), why it stopped."""
        fill = " + cache fill" if cache_fill else ""
        text = (f"P = {plan.prompt_tokens} prompt, N = {new_tokens} of {plan.budget} new tokens; "
                f"step {step}{fill}")
        if stop_reason is None:
            return text
        return f"{text}; {STOP_REASONS.get(stop_reason, stop_reason).format(n_ctx=plan.n_ctx)}"


def importance_text(rec: StepRecord) -> str:
    """What an importance method's cache holds and has evicted after `rec`, per layer as the record measured it:
    "a head holds 8 positions a layer; K/V evicted from every head: 10 per layer (60 in all 6 layers)" (PyramidKV's
    differ by layer: "4 to 14")."""

    def per_layer(counts: list[int]) -> str:
        return f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)} to {max(counts)}"

    held = list(rec.layer_positions_held) or [rec.positions_held]
    evicted = [len(layer.evicted()) for layer in rec.eviction.layers]
    return (f"a head holds {per_layer(held)} positions a layer; K/V evicted from every head: {per_layer(evicted)} "
            f"per layer ({sum(evicted)} in all {len(evicted)} layers)")
