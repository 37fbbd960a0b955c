"""What the attention view knows of a run, from its records (no Qt): the latest recorded attention, the tokens,
and for one layer the strip of weights, each head's top positions, and the texts that say so."""

from __future__ import annotations

from html import escape

import numpy as np

from kvviz.app.views.labels import chip_text
from kvviz.core.records import RunPlan, StepRecord

TOP_POSITIONS = 3  # per head, the positions its query weighs most


class AttentionState:
    """The latest record with attention of `plan`'s run, and its tokens, read one layer at a time."""

    def __init__(self, plan: RunPlan | None = None) -> None:
        self.plan = plan
        self.labels: list[str] = list(plan.prompt_labels) if plan is not None else []
        self.last: StepRecord | None = None

    def apply(self, record: StepRecord) -> bool:
        """Take one record; True when it carries attention (the strip changes)."""
        if record.token_id is not None:  # a speculative round adds its accepted drafts and its own token
            self.labels.extend(record.speculation.token_labels if record.speculation is not None
                               else (record.token_text,))
        if record.attention is None:
            return False
        self.last = record
        return True

    def values(self, layer: int) -> np.ndarray:
        """(heads, positions recorded) weights of `layer` in the latest record with attention."""
        record = self.last
        if record is None or record.attention is None:
            return np.zeros((0, 0), dtype=np.float32)
        weights = record.attention
        all_layers = np.frombuffer(weights.data, dtype=np.float32)  # a read-only view of the record's bytes
        return all_layers.reshape(weights.layers, weights.heads, weights.positions)[layer]  # (heads, positions)

    def strip(self, layer: int) -> np.ndarray:
        """(heads, plan width) weights of `layer`, NaN where no weight is recorded (positions to come)."""
        plan = self.plan
        heads, width = (max(1, plan.n_head), max(1, plan.width)) if plan is not None else (1, 1)
        strip = np.full((heads, width), np.nan, dtype=np.float32)
        values = self.values(layer)
        if values.size:
            shown = min(width, values.shape[1])
            strip[: values.shape[0], :shown] = values[:, :shown]
        return strip

    def evicted(self, layer: int, width: int) -> np.ndarray | None:
        """(width,) the positions an importance method had evicted from every head of `layer` before the latest
        record with attention (its query read none of them; those it dropped after that pass, the query read), as
        the record says; None for a run without one."""
        record = self.last
        if record is None or record.eviction is None or layer >= len(record.eviction.layers):
            return None
        state = record.eviction.layers[layer]
        gone = (np.asarray(state.heads[:width]) == 0) & (np.asarray(state.evicted_in[:width]) < record.step)
        evicted = np.zeros(width, dtype=bool)
        evicted[: gone.size] = gone
        return evicted

    def token(self, position: int, missing: str = "?") -> str:
        return chip_text(self.labels[position]) if position < len(self.labels) else missing

    def top_positions(self, layer: int, head: int) -> list[tuple[int, float]]:
        """`head`'s TOP_POSITIONS likeliest positions in `layer`: (position, weight), heaviest first."""
        values = self.values(layer)
        if values.size == 0:
            return []
        row = values[head]
        if not np.isfinite(row).any():  # a linear-attention layer: no weights over positions
            return []
        order = np.argsort(-row, kind="stable")[:TOP_POSITIONS]
        return [(int(p), float(row[p])) for p in order]

    def brightest(self, layer: int) -> float:
        """The largest weight of `layer`: the brightest shade."""
        values = self.values(layer)
        finite = values[np.isfinite(values)]  # a linear-attention layer's are NaN: no weights over positions
        return float(finite.max()) if finite.size else 0.0

    def cell_info(self, layer: int, head: int, position: int) -> str:
        """What the hover tooltip says about one weight."""
        values = self.values(layer)
        if values.size == 0 or not (0 <= head < values.shape[0] and 0 <= position < values.shape[1]):
            return ""
        query = values.shape[1] - 1
        eviction = self.last.eviction if self.last is not None else None  # an importance method's: kept or why not
        why = eviction.tooltip(layer, position) if eviction is not None and layer < len(eviction.layers) else ""
        gone = self.evicted(layer, values.shape[1])
        reads = "reads no key of it: evicted" if gone is not None and gone[position] else "reads this key"
        method = f"\n{self.plan.policy.method_name}: {why}" if why and self.plan is not None else ""
        return (f"layer {layer}, head {head}, position {position}\ntoken: {self.token(position)}\n"
                f"weight {values[head, position]:.4f} (the query at position {query} {reads}){method}")

    def heading(self, layer: int) -> str:
        """The view's heading (rich text): whose query, reading which keys."""
        record = self.last
        if self.plan is None:
            return "<b>Attention</b> &nbsp; no run yet"
        if record is None and self.plan.drafter is not None:  # each pass checks several tokens: no one query's
            return (f"<b>Attention, layer {layer}</b> &nbsp; speculative decoding: each pass checks the drafts, "
                    "many queries at once, so no single query's weights are recorded")
        if record is None:
            return f"<b>Attention, layer {layer}</b> &nbsp; recorded from the next step"
        kind = self.plan.layer_kind(layer) if layer < self.plan.n_layer else "full"
        if kind == "state":
            return (f"<b>Attention, layer {layer}</b> &nbsp; a linear-attention layer: it folds every key and value "
                    "into one fixed-size state, so its query reads no positions and has no attention weights over "
                    "them")
        query = record.fed_stop - 1
        token = escape(self.token(query, str(query)))
        source = "its cached keys" if record.use_cache else "keys recomputed this pass (no cache)"
        if kind == "shared":
            source = f"layer {self.plan.layer_shapes[layer].source}'s keys (a shared layer keeps none of its own)"
        elif kind == "window" and self.plan.layer_shapes:  # a window of the model's own: a local layer
            source += f", the last {self.plan.layer_shapes[layer].window:,} positions only (a local layer)"
        elif kind == "importance" and record.eviction is not None:  # what the method keeps, what it evicted
            state = record.eviction.layers[layer]
            gone = int(self.evicted(layer, len(state.heads)).sum())
            source += (f", the {len(state.heads) - gone} positions {self.plan.policy.method_name} kept (striped: the "
                       f"{gone} it evicted before)")
        sinks = self.sink_shares(layer)
        sink = (f"; the learned sink takes {float(sinks.mean()):.2f} of a head's softmax on average (the column "
                "\u201csink\u201d below: with the positions' weights, 1)" if sinks is not None else "")
        return (f"<b>Attention, layer {layer}</b> &nbsp; the query of \u201c{token}\u201d (position "
                f"{query}) reads {source}; brightest: weight {self.brightest(layer):.2f}{sink}")

    def sink_shares(self, layer: int) -> np.ndarray | None:
        """(heads,) the share of each head's softmax its learned sink took in `layer` (gpt-oss), in the latest
        record with attention; None for a model without learned sinks."""
        record = self.last
        if record is None or record.attention is None or not record.attention.sinks:
            return None
        weights = record.attention
        return np.frombuffer(weights.sinks, dtype=np.float32).reshape(weights.layers, weights.heads)[layer]

    def tops(self, layer: int, heads: list[int] | None = None) -> list[tuple[int, list[tuple[str, int, float]]]]:
        """Per head (every head, or `heads`) its top positions in `layer`: (head, [(token, position, weight)])."""
        values = self.values(layer)
        if values.size == 0:
            return []
        chosen = list(range(values.shape[0])) if heads is None else heads
        sinks = self.sink_shares(layer)  # learned sinks: their share first, as a column of its own ("sink")
        return [(head, [*([("sink", -1, float(sinks[head]))] if sinks is not None else []),
                        *((self.token(p, str(p)), p, w) for p, w in self.top_positions(layer, head))])
                for head in chosen]

    def top_list(self, layer: int, heads: list[int] | None = None) -> str:
        """Per head (every head, or `heads`) its top positions in `layer`, as text."""
        return tops_text(self.tops(layer, heads))


def tops_text(tops: list[tuple[int, list[tuple[str, int, float]]]]) -> str:
    """Per head its top positions, a line a head: "h3: ·flies @1 0.52, Time @0 0.31, ..."; a learned sink's share
    first, where the model has them: "h3: sink 0.40, ·flies @1 0.31, ..."."""
    return "\n".join(f"h{head}: " + ", ".join(f"{token} @{p} {w:.2f}" if p >= 0 else f"{token} {w:.2f}"
                                             for token, p, w in positions)
                     for head, positions in tops)
