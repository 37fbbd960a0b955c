"""A layer that keeps a sliding window of positions, and attention sinks: Mistral's window, StreamingLLM's sinks."""

from __future__ import annotations

import torch

from kvviz.cache.attention import attend
from kvviz.cache.layers import Held, LayerCache


class WindowLayer(LayerCache):
    """Keeps the first `sinks` positions ever fed and the last `window` (plus `spare` more, so that `crop` can roll
    back that far) in a rolling buffer of `sinks + window + spare` slots: its memory stops growing there. A
    one-token pass writes its key and value over the slot of the position that just left, and reads every slot; a
    longer pass (a prefill) reads what is held and its own rows, then keeps what the window keeps. `held` lists the
    position each slot holds; the queries of a pass see the keys `Held.window` and `Held.sinks` say."""

    def __init__(self, heads: int, head_dim: int, window: int, sinks: int = 0, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", spare: int = 0) -> None:
        if window <= 0 or sinks < 0 or spare < 0:
            raise ValueError(f"a window layer needs a window, got window={window}, sinks={sinks}, spare={spare}")
        super().__init__()
        self.window, self.sinks, self.spare = window, sinks, spare
        self.slots = sinks + window + spare
        self.kv = torch.zeros((2, batch_size, heads, self.slots, head_dim), dtype=dtype, device=device)
        self.held: list[int] = []

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        T = k.shape[2]
        start = positions if isinstance(positions, int) else int(positions[0])
        if start != self.length:
            raise ValueError(f"positions start at {start} but the layer has seen {self.length}")
        end = self.length = start + T
        keys, values = self.kv.unbind(0)  # (B, h, slots, d) each
        held, sinks, keep = self.held, self.sinks, self.window + self.spare
        self.reused = len(held)
        self.last_written = (start, end)  # positions, not slots: the grid shows where each position's K/V went
        leaving = start - keep  # the newest position this layer no longer keeps once `start` comes in
        evicting = leaving >= sinks and leaving in held
        if T == 1 and (evicting or len(held) < self.slots):
            slot = held.index(leaving) if evicting else len(held)
            keys.narrow(2, slot, 1).copy_(k)
            values.narrow(2, slot, 1).copy_(v)
            if evicting:
                held[slot] = start
                self.evicted = (leaving, leaving + 1)
            else:
                held.append(start)
                self.evicted = (start, start)
            self.reused = len(held) - 1  # every slot is read; one of them was written now
            n = len(held)
            at = torch.tensor(held, device=k.device)
            return Held(keys.narrow(2, 0, n), values.narrow(2, 0, n), at, self.window, sinks)  # (B, h, n, d)
        n = len(held)
        all_keys = torch.cat((keys.narrow(2, 0, n), k), dim=2)  # (B, h, n + T, d): held, then this pass's
        all_values = torch.cat((values.narrow(2, 0, n), v), dim=2)
        at = held + list(range(start, end))
        kept = [i for i, p in enumerate(at) if p < sinks or p >= end - keep]
        dropped = [p for p in at if sinks <= p < end - keep]
        self._keep(all_keys, all_values, kept)
        self.held = [at[i] for i in kept]
        self.evicted = (min(dropped), max(dropped) + 1) if dropped else (end, end)
        return Held(all_keys, all_values, torch.tensor(at, device=k.device), self.window, sinks)

    def _keep(self, keys: torch.Tensor, values: torch.Tensor, rows: list[int]) -> None:
        """Move `rows` of `keys` and `values` (B, h, n, d) to the front slots, in order."""
        index = torch.tensor(rows, dtype=torch.long, device=keys.device)
        self.kv[0].narrow(2, 0, len(rows)).copy_(keys.index_select(2, index))
        self.kv[1].narrow(2, 0, len(rows)).copy_(values.index_select(2, index))

    def decode(self, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        """One token's step (LayerCache.decode). The newest query sees every position the layer keeps (the last
        `window` and the sinks), so it attends to them all, unmasked; only the `spare` positions kept behind the
        window for a rollback are held but hidden, and then the read is masked as the teaching pass's is."""
        if not self.spare:
            return super().decode(position, q, k, v, scale)
        held = self.update(position, k, v)
        group = q.shape[1] // held.keys.shape[1]
        keys, values = (t.repeat_interleave(group, dim=1) for t in (held.keys, held.values))  # (1, nh, S, hd)
        return attend(q, keys, values, held, torch.tensor([position], device=q.device), scale=scale)

    def crop(self, position: int) -> None:
        if not 0 <= position <= self.length:
            raise ValueError(f"a cache of {self.length} positions cannot crop to {position}")
        needed = set(range(min(self.sinks, position))) | set(range(max(self.sinks, position - self.window + 1),
                                                                   position))
        missing = needed - set(self.held)
        if missing:
            raise ValueError(f"the window layer no longer holds position {min(missing)}: it rolls back at most "
                             f"{self.spare} positions past its window of {self.window}")
        rows = [i for i, p in enumerate(self.held) if p < position]
        n = len(self.held)
        self._keep(self.kv[0].narrow(2, 0, n).clone(), self.kv[1].narrow(2, 0, n).clone(), rows)
        self.held = [self.held[i] for i in rows]
        self.length = position
        self.evicted = (position, position)

    @property
    def positions_held(self) -> int:
        return len(self.held)

    @property
    def bytes_held(self) -> int:
        held = self.kv.narrow(3, 0, len(self.held))  # (2, B, h, held, d)
        return held.numel() * held.element_size()

    @property
    def bytes_allocated(self) -> int:
        return self.kv.numel() * self.kv.element_size()
