"""A linear-attention layer's cache (kvviz.models.qwen3_5's Gated DeltaNet): a fixed-size state, not positions.

A linear-attention layer folds each position's key and value into a state of a fixed size and then forgets them:
its cache is that state, whatever the length. For Gated DeltaNet it is two tensors a sequence: the convolution's
window (the last kernel - 1 inputs of its short causal convolution over q, k and v) and the recurrent state (one
k_dim x v_dim matrix a value head). Both are allocated up front and overwritten by every pass.

The layer keeps the contract of kvviz.cache.layers.LayerCache where it can, and says plainly where it cannot:
- `length` counts the positions fed (the next pass starts there); `positions_held` is 0: it holds no position's
  key or value, so nothing is evicted (`evicted` is always empty) and nothing is reused (`reused` is 0: a pass
  re-reads the state, not earlier positions' rows);
- `bytes_held` and `bytes_allocated` are measured from its tensors: a constant, whatever the length;
- `crop(position)` cannot undo a fold: it rolls back only to a position whose state it kept. It keeps the state
  as it stood before each of its last `spare` passes (the end of the pass before, as WindowLayer keeps `spare`
  rows to roll back into), and position 0 (the zero state) always; any other position is a ValueError.

A teaching layer reads and writes it explicitly: `conv, recurrent = layer.read()` before its pass, and
`layer.write(positions, conv, recurrent)` after it. `update` (keys and values in, what to attend to out) has no
meaning here, and says so.
"""

from __future__ import annotations

import torch

from kvviz.cache.layers import Held, LayerCache


class StateLayer(LayerCache):
    """One linear-attention layer's state, for `batch_size` sequences: `conv` (B, *conv_shape), the convolution's
    window, and `recurrent` (B, *recurrent_shape), the recurrent state; `spare` snapshots of both to roll back
    into (counted in `bytes_held` while they hold a state)."""

    def __init__(self, conv_shape: tuple[int, ...], recurrent_shape: tuple[int, ...], batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", spare: int = 0) -> None:
        if spare < 0:
            raise ValueError(f"a state layer keeps a whole number of snapshots, got spare={spare}")
        super().__init__()
        self.spare = spare
        self.conv = torch.zeros((batch_size, *conv_shape), dtype=dtype, device=device)
        self.recurrent = torch.zeros((batch_size, *recurrent_shape), dtype=dtype, device=device)
        self._saved_conv = torch.zeros((spare, batch_size, *conv_shape), dtype=dtype, device=device)
        self._saved_recurrent = torch.zeros((spare, batch_size, *recurrent_shape), dtype=dtype, device=device)
        self._saved_at = [-1] * spare  # the length each snapshot slot's state was taken at (-1: empty)

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state after the `length` positions fed so far: the convolution's window and the recurrent state."""
        return self.conv, self.recurrent

    def write(self, positions: torch.Tensor | int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Overwrite the state with the one after this pass, which fed `positions` ((T,), or the first position of
        a one-token pass; they continue the layer)."""
        start = positions if isinstance(positions, int) else int(positions[0])
        count = 1 if isinstance(positions, int) else len(positions)
        if start != self.length:
            raise ValueError(f"positions start at {start} but the layer has seen {self.length}")
        if self.spare:
            self._save()
        self.conv.copy_(conv)
        self.recurrent.copy_(recurrent)
        self.length = start + count
        self.reused = 0
        self.last_written = (start, self.length)  # positions, as a window layer's: the ones folded in
        self.evicted = (self.length, self.length)

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        raise TypeError("a state layer holds no keys and values to attend to: read() its state, write() the next")

    def _save(self) -> None:
        """Keep the state as it stands now (after `length` positions) in a free slot, or the oldest one's."""
        slot = min(range(self.spare), key=lambda i: self._saved_at[i])  # an empty slot (-1) first, else the oldest
        self._saved_conv[slot].copy_(self.conv)
        self._saved_recurrent[slot].copy_(self.recurrent)
        self._saved_at[slot] = self.length

    def crop(self, position: int) -> None:
        """Roll back to the state after `position` positions: one it kept, or the zero state at 0."""
        if not 0 <= position <= self.length:
            raise ValueError(f"a cache of {self.length} positions cannot crop to {position}")
        if position == 0:
            self.conv.zero_()
            self.recurrent.zero_()
        elif position in self._saved_at:
            slot = self._saved_at.index(position)
            self.conv.copy_(self._saved_conv[slot])
            self.recurrent.copy_(self._saved_recurrent[slot])
        elif position != self.length:
            kept = sorted(p for p in self._saved_at if p >= 0)
            raise ValueError(f"the state layer cannot roll back to position {position}: a state holds no positions, "
                             f"and it kept the state at {', '.join(map(str, kept)) or 'no earlier position'} only "
                             f"(the start of each of its last {self.spare} passes, and 0)")
        self._saved_at = [p if p < position else -1 for p in self._saved_at]
        self.length = position
        self.evicted = (position, position)

    @property
    def positions_held(self) -> int:
        return 0

    @property
    def snapshots(self) -> int:
        """States kept to roll back into."""
        return sum(p >= 0 for p in self._saved_at)

    @property
    def bytes_held(self) -> int:
        """The state's bytes, and its snapshots' while they hold one: measured from the tensors, whatever the
        length."""
        state = self.conv.numel() * self.conv.element_size() + self.recurrent.numel() * self.recurrent.element_size()
        return state * (1 + self.snapshots)

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv, self.recurrent, self._saved_conv,
                                                          self._saved_recurrent))
