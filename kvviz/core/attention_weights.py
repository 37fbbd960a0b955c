"""The attention weights a pass's newest query gave each position, as a record carries them: immutable bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionWeights:
    """The attention weights of a pass's newest query: softmax(q·Kᵀ/√d) over every position it attends to.

    Shaped (layers, heads, positions), `positions` being the pass's `fed_stop` (the query's own position is
    the last), kept as float32 bytes in that order: immutable and small enough for every record of a run.
    """

    layers: int
    heads: int
    positions: int
    data: bytes  # float32, native byte order, (layers, heads, positions) row-major
    # a model with learned attention sinks (gpt-oss): the share of each head's softmax its sink took, float32
    # (layers, heads); a row's weights over the positions and its sink share sum to 1. b"": no learned sinks
    sinks: bytes = b""

    def __post_init__(self) -> None:
        if len(self.data) != 4 * self.layers * self.heads * self.positions:
            raise ValueError(f"{len(self.data)} bytes do not hold {self.layers}x{self.heads}x{self.positions} floats")
        if self.sinks and len(self.sinks) != 4 * self.layers * self.heads:
            raise ValueError(f"{len(self.sinks)} bytes do not hold {self.layers}x{self.heads} sink shares")

    def sink_share(self, layer: int, head: int) -> float | None:
        """The share of `head`'s softmax in `layer` that its learned sink took (None: the model has none)."""
        if not self.sinks:
            return None
        return struct.unpack_from("=f", self.sinks, 4 * (layer * self.heads + head))[0]

    def row(self, layer: int, head: int) -> tuple[float, ...]:
        """The weights of `head` in `layer` over positions 0 .. positions-1."""
        if not (0 <= layer < self.layers and 0 <= head < self.heads):
            raise IndexError(f"layer {layer}, head {head} outside {self.layers} layers x {self.heads} heads")
        start = 4 * (layer * self.heads + head) * self.positions
        return struct.unpack_from(f"={self.positions}f", self.data, start)

    def layer(self, layer: int) -> tuple[tuple[float, ...], ...]:
        """Every head's row of `layer`: (heads, positions)."""
        return tuple(self.row(layer, head) for head in range(self.heads))

    def as_lists(self) -> list[list[list[float]]]:
        """A list per layer, of a list per head, of weights per position (for JSON)."""
        return [[list(self.row(layer, head)) for head in range(self.heads)] for layer in range(self.layers)]
