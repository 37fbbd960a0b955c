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
- `crop(position)` cannot undo a fold: it rolls back only to a state it kept. It keeps the states after
  `length - spare` .. `length - 1` positions (as WindowLayer keeps `spare` rows to roll back into): the state
  before each pass, and the state after each position inside a pass, which the pass hands `write` (Gated
  DeltaNet's does). So a crop reaches any position from `length - spare` on, in particular any position inside a
  latest pass of at most `spare` positions; after a crop, it reaches back only as far as the states it still
  holds. The zero state at 0 it always reaches; any other position is a ValueError.

A teaching layer reads and writes it explicitly: `conv, recurrent = layer.read()` before its pass, and
`layer.write(positions, conv, recurrent, earlier)` after it. `update` (keys and values in, what to attend to out)
has no meaning here, and says so.
"""

from __future__ import annotations

import torch

from kvviz.cache.layers import Held, LayerCache


class StateLayer(LayerCache):
    """One linear-attention layer's state, for `batch_size` sequences: `conv` (B, *conv_shape), the convolution's
    window, and `recurrent` (B, *recurrent_shape), the recurrent state; `spare` snapshots of both, the states after
    `length - spare` .. `length - 1` positions, to roll back into (counted in `bytes_held` while they hold one)."""

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

    def write(self, positions: torch.Tensor | int, conv: torch.Tensor, recurrent: torch.Tensor,
              earlier: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Overwrite the state with the one after this pass, which fed `positions` ((T,), or the first position of
        a one-token pass; they continue the layer). `earlier`, the windows and recurrent states (n, B, ...) after
        each of the n positions just before the pass's last one (oldest first, n < T), are kept to roll back into,
        as far as `spare` reaches; without them the layer rolls back to the start of the pass, not inside it."""
        start = positions if isinstance(positions, int) else int(positions[0])
        count = 1 if isinstance(positions, int) else len(positions)
        if start != self.length:
            raise ValueError(f"positions start at {start} but the layer has seen {self.length}")
        steps, recurrents = (0, 0) if earlier is None else (earlier[0].shape[0], earlier[1].shape[0])
        if steps >= count or recurrents != steps:
            raise ValueError(f"a pass of {count} positions has at most {count - 1} states before its last, as many "
                             f"windows as recurrent states; got {steps} windows and {recurrents} recurrent states")
        end = start + count
        oldest = end - self.spare  # the earliest length a crop after this pass may reach
        self._saved_at = [at if at >= oldest else -1 for at in self._saved_at]
        if start >= oldest and self.spare:
            self._save(start, self.conv, self.recurrent)  # the state before the pass
        for i in range(steps):  # the states inside the pass: after end - steps .. end - 1 positions
            if end - steps + i >= oldest:
                self._save(end - steps + i, earlier[0][i], earlier[1][i])
        self.conv.copy_(conv)
        self.recurrent.copy_(recurrent)
        self.length = end
        self.reused = 0
        self.last_written = (start, end)  # positions, as a window layer's: the ones folded in
        self.evicted = (end, end)

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        raise TypeError("a state layer holds no keys and values to attend to: read() its state, write() the next")

    def _save(self, at: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Keep `conv` and `recurrent`, the state after `at` positions, in a free slot (`write` frees the slots of
        states older than a crop may reach, so one is free)."""
        slot = self._saved_at.index(-1)
        self._saved_conv[slot].copy_(conv)
        self._saved_recurrent[slot].copy_(recurrent)
        self._saved_at[slot] = at

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
            kept = sorted(at for at in self._saved_at if at >= 0)
            raise ValueError(f"the state layer cannot roll back to position {position}: a state holds no positions, "
                             f"and it kept the state at {', '.join(map(str, kept)) or 'no earlier position'} only "
                             f"(at most the last {self.spare} positions before {self.length}, and 0)")
        self._saved_at = [at if at < position else -1 for at in self._saved_at]
        self.length = position
        self.evicted = (position, position)

    @property
    def positions_held(self) -> int:
        return 0

    @property
    def snapshots(self) -> int:
        """States kept to roll back into."""
        return sum(at >= 0 for at in self._saved_at)

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
