"""What the K/V grid knows about each cell of a run, taken from its records (no Qt): the cell states, when
each key and value was last computed, how often it was computed and reused, which position's K/V a slot holds
(a cache broken on purpose writes one slot late), and the tooltip that says so."""

from __future__ import annotations

import numpy as np

from kvviz.app.views.grid.cell_states import (
    COMPUTED,
    DRAFTED,
    EMPTY,
    EVICTED,
    PENDING,
    REUSED,
    ROLLED_BACK,
    SHARED,
    STALE,
    STATE,
    state_names,
)
from kvviz.app.views.labels import chip_text
from kvviz.core.eviction import EvictionState
from kvviz.core.records import RunPlan, StepRecord


class GridState:
    """The cells of one run, (n_layer, width) arrays filled from its records, in order.

    `states` holds EMPTY, PENDING, COMPUTED, REUSED or STALE (grid_cells); `computed_at` the pass (1-based) of
    each cell's latest computation, -1 for none; `times_computed` how often it was computed; `times_reused` how
    often it was read from the cache since. `labels` are the tokens, position by position.

    A cell is a position and, with the cache, the cache slot of that position. The records say which slots
    each pass wrote (`written_positions`): on a cache broken on purpose they are one later than the positions
    it fed, so the amber cell is the slot written, one column right of its token, and the fed token's own
    slot, read but not written, is STALE. `holds` is the position whose K/V each slot holds (-1: none yet).

    Speculative decoding (a record with `speculation`): a round's pass computes the pending token (COMPUTED) and the
    drafts after it; at its record the drafts the target accepted are DRAFTED (reused, teal, from the next record
    on, as every cached position) and the ones it rejected ROLLED_BACK, struck through for that one record:
    the next one clears them (EMPTY, or PENDING where the text's next token now stands). `drafts` holds the draft
    labels of the latest round, by position.
    """

    def __init__(self, plan: RunPlan | None = None) -> None:
        self.plan = plan
        shape = (plan.n_layer, max(1, plan.width)) if plan is not None else (1, 1)
        self.labels: list[str] = list(plan.prompt_labels) if plan is not None else []
        self.states = np.zeros(shape, dtype=np.uint8)
        if plan is not None:
            self.states[:, : plan.prompt_tokens] = PENDING
        self.computed_at = np.full(shape, -1, dtype=np.int32)
        self.times_computed = np.zeros(shape, dtype=np.int32)
        self.times_reused = np.zeros(shape, dtype=np.int32)
        self.holds = np.full(shape, -1, dtype=np.int32)
        self.fed = np.zeros(shape, dtype=bool)  # the position's K/V has been computed (wherever it was written)
        self.evicted_at = np.full(shape, -1, dtype=np.int32)  # the pass (1-based) that evicted it, -1: none
        self.last: StepRecord | None = None
        # where the model's layers differ (plan.layer_shapes): the layers a window evicts from, those that keep no
        # K/V of their own, and those that keep a fixed-size state instead of positions
        kinds = [shape.kind for shape in plan.layer_shapes] if plan is not None else []
        self.shared_rows = np.array([kind == "shared" for kind in kinds], dtype=bool)
        self.state_rows = np.array([kind == "state" for kind in kinds], dtype=bool)
        self.window_rows = np.array([kind == "window" for kind in kinds], dtype=bool)
        # an importance method's (H2O...): what the latest pass kept and dropped, and each position's score
        self.method = plan.policy.method_name if plan is not None else ""
        self.eviction: EvictionState | None = None
        self.scores = np.full(shape, np.nan, dtype=np.float32)
        self.heads_holding = np.zeros(shape, dtype=np.int32)  # KV heads that hold each position (0: none, or no method)
        self.rolled_back = slice(0, 0)  # speculative decoding: the positions struck through now (the last round's)
        self.drafts: dict[int, str] = {}  # the latest round's drafts: position -> label

    @property
    def n_layer(self) -> int:
        return self.states.shape[0]

    @property
    def width(self) -> int:
        return self.states.shape[1]

    def apply(self, record: StepRecord) -> None:
        """One forward pass: the positions it computed and reused, and the token it added."""
        width = self.width
        self._clear_rolled_back()
        fed = record.computed_positions(width)
        written = record.written_positions(width) if record.kv_written is not None else fed
        computed = np.s_[:, written]  # every layer, the slots this pass wrote
        start, stop = record.kv_evicted  # a window's: gone before this pass read the cache
        if record.eviction is not None:  # an importance method's, layer by layer (gone from every head)
            self._take_eviction(record.eviction, record.use_cache)
        elif self.window_rows.size:  # the model's own windows, on the layers it gives one
            self.evicted_at[self.window_rows, min(start, width):min(stop, width)] = record.step + 1
        else:
            first = self.plan.policy.first_layer if self.plan is not None else 0  # layers below keep every position
            self.evicted_at[first:, min(start, width):min(stop, width)] = record.step + 1
        reused = np.zeros(self.states.shape, dtype=bool)
        reused[:, record.reused_positions(width)] = True
        reused &= self.evicted_at < 0  # what a window evicted is read no more
        states = self.states
        states[states != EMPTY] = PENDING
        states[reused] = REUSED
        if written != fed:  # a slot the pass read as its own token's, but did not write
            states[:, fed] = STALE
        states[computed] = COMPUTED
        states[self.evicted_at >= 0] = EVICTED
        if self.state_rows.any() and record.use_cache:  # one block, overwritten: this pass's K/V folded in
            states[self.state_rows] = STATE
            states[self.state_rows, fed] = COMPUTED
        self.fed[:, fed] = True
        self.holds[computed] = np.arange(fed.start, fed.start + (written.stop - written.start))
        self.computed_at[computed] = record.step + 1
        self.times_computed[computed] += 1
        self.times_reused[computed] = 0
        self.times_reused[reused] += 1
        if record.speculation is not None:
            self._mark_drafts(record)
        if record.token_id is not None:
            # a speculative round adds its accepted drafts and the target's own token, a plain pass its token
            self.labels.extend(record.speculation.token_labels if record.speculation is not None
                               else (record.token_text,))
            new_position = record.sequence_length - 1
            if new_position < width and states[0, new_position] == EMPTY:  # (a late write may have filled it)
                states[:, new_position] = PENDING
        states[self.shared_rows] = SHARED  # computes queries only: no cell of its own
        self.last = record

    def _take_eviction(self, eviction: EvictionState, cached: bool) -> None:
        """What an importance method keeps after this pass: each position's score, and (`cached`: the cache drops
        them; an uncached pass recomputes them and only attends around them) the positions no head holds any more,
        evicted at the pass that dropped them from their last head."""
        self.eviction = eviction
        for layer, state in enumerate(eviction.layers[: self.n_layer]):
            n = min(len(state.heads), self.width)
            self.scores[layer, :n] = state.scores[:n]
            self.heads_holding[layer, :n] = state.heads[:n]
            if cached:
                gone = self.heads_holding[layer, :n] == 0
                self.evicted_at[layer, :n] = np.where(gone, np.asarray(state.evicted_in[:n]) + 1, -1)

    def score_shades(self) -> np.ndarray:
        """(n_layer, width) how strongly View > Scores draws each cell an importance method keeps in its cache (the
        reused ones): its score's rank among them in its layer, from 0 (the lowest: next to go) to 1 (the highest);
        NaN for a cell not shaded (just computed, evicted, not fed yet, a run without a cache or a method)."""
        shades = np.full(self.states.shape, np.nan, dtype=np.float32)
        if self.plan is None or not self.plan.use_cache:  # nothing kept: every position recomputed each pass
            return shades
        kept = (self.states == REUSED) & np.isfinite(self.scores) & (self.heads_holding > 0)  # (the new: amber)
        for layer in range(self.n_layer):
            positions = np.flatnonzero(kept[layer])
            if positions.size:
                ranks = np.argsort(np.argsort(self.scores[layer, positions], kind="stable"), kind="stable")
                shades[layer, positions] = ranks / max(1, positions.size - 1) if positions.size > 1 else 1.0
        return shades

    def _mark_drafts(self, record: StepRecord) -> None:
        """A speculative round's drafts, after its pending token: those the target accepted DRAFTED, the ones it
        rejected, whose K/V the pass wrote and the crop took back, ROLLED_BACK (as the record's `rolled_back` says)."""
        spec, width = record.speculation, self.width
        first = min(spec.start + 1, width)
        kept, stop = (min(position, width) for position in spec.rolled_back)
        self.states[:, first:kept] = DRAFTED
        self.states[:, kept:stop] = ROLLED_BACK
        self.rolled_back = slice(kept, stop)
        self.drafts = {spec.start + 1 + i: label for i, label in enumerate(spec.drafted_labels)}

    def _clear_rolled_back(self) -> None:
        """The last round's rolled-back positions, struck through for one record, are gone from the cache: empty
        again, but the text's next token (its K/V not computed yet) where it stands among them."""
        gone = self.rolled_back
        if gone.start >= gone.stop:
            return
        self.states[:, gone] = EMPTY
        self.computed_at[:, gone] = -1
        self.holds[:, gone] = -1
        self.fed[:, gone] = False
        self.times_reused[:, gone] = 0
        text = self.last.sequence_length if self.last is not None else 0
        self.states[:, gone.start:max(gone.start, min(gone.stop, text))] = PENDING
        self.rolled_back = slice(0, 0)

    def label(self, position: int) -> str:
        """The token at `position` as a chip shows it, or "" past the tokens so far."""
        return chip_text(self.labels[position]) if position < len(self.labels) else ""

    def cell_info(self, layer: int, position: int, head: int | None = None) -> str:
        """What the hover tooltip says about one cell: of `layer`, or of one of its heads."""
        plan = self.plan
        if plan is None or not (0 <= layer < self.n_layer and 0 <= position < self.width):
            return ""
        if head is not None and not 0 <= head < plan.cache_heads:
            return ""
        token = self.label(position) if position < len(self.labels) else "(not generated yet)"
        group = plan.query_group
        shared = "" if group == 1 or head is None else \
            f" (read by query heads {', '.join(str(q) for q in range(head * group, (head + 1) * group))})"
        head_kind = "KV head" if group > 1 else "head"
        where = f"layer {layer}" if head is None else f"layer {layer}, {head_kind} {head}{shared}"
        if plan.cache_parts and head is not None:
            name, numbers = plan.cache_parts[head]
            where = f"layer {layer}, its {name} ({numbers} numbers, shared by every head)"
        lines = [f"{where}, position {position}", f"token: {token}"]
        kind = plan.layer_kind(layer)
        if kind == "shared":
            source = plan.layer_shapes[layer].source
            lines.append(f"a shared layer: it computes queries only and reads layer {source}'s keys and values; "
                         "it keeps none of its own (0 bytes)")
            return "\n".join(lines)
        if kind == "state" and plan.use_cache:
            size = plan.layer_shapes[layer].state_elements * plan.dtype_bytes
            lines.append(f"a linear-attention layer: every position's key and value are folded into one state of "
                         f"{size:,} bytes, overwritten each step; it keeps no position")
            return "\n".join(lines)
        kept = "latent" if plan.cache_parts else "K/V"  # latent attention computes and keeps a latent
        state = int(self.states[layer, position])
        if state in (DRAFTED, ROLLED_BACK):
            lines.append(self._draft_info(layer, position, state, kept))
            if state == ROLLED_BACK:  # no longer in the cache: nothing more to say of it
                return "\n".join([*lines, state_names(bool(plan.cache_parts))[state]])
        at = int(self.computed_at[layer, position])
        holds, broken = int(self.holds[layer, position]), bool(plan.cache_fault)
        evicted_at = int(self.evicted_at[layer, position])
        dropped = self.eviction.tooltip(layer, position) if self.eviction is not None else ""  # H2O's...
        if evicted_at >= 0 and dropped:
            lines.extend([f"K/V computed at step {at}; {self.method} evicted it: no later step reads it", dropped])
        elif evicted_at >= 0:
            window = plan.policy.window
            lines.append(f"K/V computed at step {at}, evicted at step {evicted_at}: outside the window of "
                         f"{window} positions, no later step reads it")
        elif at < 0 and self.fed[layer, position]:
            lines.append("its K/V was computed but written one slot late: this slot was never written")
        elif at < 0:
            lines.append(f"{kept} not computed yet" if state == PENDING else "position does not exist yet")
        else:
            lines.append(f"{kept} computed at step {at}")
            if broken and holds != position:
                lines.append(f"this slot holds position {holds}'s K/V: written one slot late (broken cache)")
            if plan.use_cache:
                n = int(self.times_reused[layer, position])
                lines.append(f"reused {n} time{'s' if n != 1 else ''} since")
            else:
                n = int(self.times_computed[layer, position])
                lines.append(f"no cache: computed {n} time{'s' if n != 1 else ''} so far, reused never")
        if dropped and evicted_at < 0:  # kept (by how many heads, at what score); uncached: what the query reads
            lines.append(dropped if plan.use_cache else f"{self.method} (the query reads what it keeps): {dropped}")
        if state != EMPTY:
            lines.append(state_names(bool(plan.cache_parts), self.method if plan.use_cache else "")[state])
        if plan.use_cache and position < plan.policy.sinks:
            lines.append("an attention sink: kept in the cache for good")
        kv = "K and V" if head is None else f"K and V of head {head}"
        heads = plan.cache_heads
        if plan.use_cache and state in (COMPUTED, REUSED, STALE, DRAFTED) and plan.cache_parts:  # a latent, not K and V
            b = plan.dtype_bytes
            sizes = [numbers for _, numbers in plan.cache_parts]
            if head is None:
                lines.append(f"the latent and the RoPE key: ({' + '.join(map(str, sizes))}) × {b} bytes = "
                             f"{sum(sizes) * b:,} bytes; each head's K and V are rebuilt from them")
                if plan.multi_head_numbers:  # what the latent saves
                    key, value = plan.head_key_value
                    lines.append(f"multi-head attention with its {plan.n_head} heads would keep {plan.n_head} × "
                                 f"({key} + {value}) × {b} = {plan.multi_head_numbers * b:,} bytes")
            else:
                lines.append(f"{plan.cache_parts[head][0]}: {sizes[head]} × {b} bytes = {sizes[head] * b:,} bytes")
        elif plan.use_cache and state in (COMPUTED, REUSED, STALE, DRAFTED) and heads > 0:  # in the cache: their bytes
            b, d = plan.dtype_bytes, plan.head_dim
            if plan.layer_shapes:  # a model whose layers differ: this layer's own heads (Gemma 4's global layers)
                heads, d = plan.layer_shapes[layer].kv_heads, plan.layer_shapes[layer].head_dim
            if head is None:
                total = 2 * heads * d * b
                kind = "heads" if group == 1 else "KV heads"
                lines.append(f"{kv}: 2 \u00d7 {heads} {kind} \u00d7 {d} \u00d7 {b} bytes = {total:,} bytes")
            else:
                lines.append(f"{kv}: 2 \u00d7 {d} \u00d7 {b} bytes = {2 * d * b:,} bytes")
        elif not plan.use_cache and at >= 0:
            lines.append(f"{kv}: recomputed each pass, not kept (no cache)")
        return "\n".join(lines)

    def _draft_info(self, layer: int, position: int, state: int, kept: str) -> str:
        """What a drafted cell's tooltip adds: the draft, and whether the target kept its `kept` (K/V or latent)."""
        draft = chip_text(self.drafts.get(position, "?"))
        step = int(self.computed_at[layer, position])
        if state == DRAFTED:
            return f"the draft {draft}, checked at step {step}: the target accepted it; its {kept} stays in the cache"
        return (f"the draft {draft}, checked at step {step}: the target rejected it; its {kept} was written, then "
                "rolled back (cropped from the cache): no later step reads it")
