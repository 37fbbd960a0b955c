"""What an importance method kept and dropped after a pass, layer by layer: the record the grid, the attention view
and the lessons read (kvviz.cache.importance makes it). Torch-free and Qt-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerEviction:
    """One layer after a pass, for each position fed so far (0 .. fed_stop - 1): how many of its KV heads hold it
    (`heads`; 0: evicted from all), the method's score of it (`scores`: the mean over the heads of each head's
    score, a dropped head's as it stood when that head dropped it), and the pass that dropped it from its last
    head (`evicted_in`; -1 while a head holds it)."""

    heads: tuple[int, ...]
    scores: tuple[float, ...]
    evicted_in: tuple[int, ...]
    budget: int  # positions a head of this layer keeps at most

    def kept(self) -> tuple[int, ...]:
        """Positions some head holds."""
        return tuple(p for p, n in enumerate(self.heads) if n)

    def evicted(self) -> tuple[int, ...]:
        """Positions no head holds any more."""
        return tuple(p for p, n in enumerate(self.heads) if not n)


@dataclass(frozen=True)
class EvictionState:
    """Every layer's LayerEviction after one pass of an importance method (`method`: a key of
    kvviz.core.policy.EVICTION_METHODS; `score`: what its scores are, in words), with the KV heads a layer has."""

    method: str
    score: str
    kv_heads: int
    layers: tuple[LayerEviction, ...]

    def evicted_now(self, step: int) -> tuple[tuple[int, ...], ...]:
        """Per layer: the positions pass `step` dropped from their last head."""
        return tuple(tuple(p for p, s in enumerate(layer.evicted_in) if s == step) for layer in self.layers)

    def tooltip(self, layer: int, position: int) -> str:
        """What the grid says of a cell: held by how many heads, with its score, or when and at what score it went."""
        state = self.layers[layer]
        if position >= len(state.heads):
            return ""
        score = f"{self.score} {state.scores[position]:.4g}"
        if state.heads[position]:
            share = "every head" if state.heads[position] == self.kv_heads else \
                f"{state.heads[position]} of {self.kv_heads} heads"
            return f"kept by {share}: {score}"
        return f"evicted at step {state.evicted_in[position] + 1}: {score}"
