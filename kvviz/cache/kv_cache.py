"""The KV cache: preallocated per-layer key and value buffers with an explicit length."""

from __future__ import annotations

import torch

from kvviz.core.records import EXACT, CachePolicy


class KVCache:
    """Keys and values of every layer for positions `0 .. length-1`.

    Buffers are allocated once, shaped (layers, 2, batch, heads, capacity, head_dim) with
    keys at index 0 and values at 1 of the second axis, so the memory a run needs is visible
    up front and one copy stores a position's key and value; `bytes_used` counts only the
    filled part. Positions are explicit: `update` and `append` write rows at the positions
    they are given, which must continue the cache without gaps. `LateWriteCache` is the same
    cache broken on purpose, for teaching.
    """

    def __init__(
        self,
        n_layer: int,
        n_head: int,
        head_dim: int,
        capacity: int,
        batch_size: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layer, 2, batch_size, n_head, capacity, head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)  # (L, 2, B, nh, S, hs)
        self.keys = self.kv[:, 0]  # (L, B, nh, S, hs)
        self.values = self.kv[:, 1]  # (L, B, nh, S, hs)
        self._layer_kv = list(self.kv.unbind(0))  # per-layer views, (2, B, nh, S, hs) each
        self.capacity = capacity
        self.n_layer = n_layer
        self.length = 0
        self._layer_lengths = [0] * n_layer
        self.last_written = (0, 0)  # the slots [start, stop) the latest update or append wrote to
        self.reused = [0] * n_layer  # per layer: rows the latest update or append returned without writing them
        self.policy: CachePolicy = EXACT  # every position is kept (WindowCache keeps fewer)
        self.evicted = (0, 0)  # positions [start, stop) the latest pass evicted: none in an exact cache

    def reset(self) -> None:
        """Forget every cached position; the buffers stay allocated."""
        self.length = 0
        self._layer_lengths = [0] * self.n_layer

    def _claim(self, layer: int, position: int, count: int) -> int:
        """Check that `count` rows at `position` continue `layer` and fit; return the new length."""
        start = self._layer_lengths[layer]
        end = start + count
        if end > self.capacity:
            raise ValueError(f"KV cache is full: {self.capacity} positions, asked for {end}")
        if position != start:
            raise ValueError(f"layer {layer}: positions start at {position} but the cache holds {start}")
        self._layer_lengths[layer] = end
        if layer == self.n_layer - 1:
            self.length = end
        return end

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` (B, nh, T, hs) at `positions` (T,) of `layer`; return all cached K, V."""
        T = k.shape[2]
        start = int(positions[0])
        end = self._claim(layer, start, T)
        keys, values = self._layer_kv[layer].unbind(0)  # (B, nh, S, hs) each
        keys.narrow(2, start, T).copy_(k)
        values.narrow(2, start, T).copy_(v)
        self.last_written = (start, end)
        self.reused[layer] = end - T
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)  # (B, nh, end, hs)

    def append(self, layer: int, position: int, kv: torch.Tensor) -> torch.Tensor:
        """Store one position's key and value `kv` (2, B, nh, 1, hs) of `layer`; return all cached (2, B, nh, S, hs)."""
        end = self._claim(layer, position, 1)
        cached = self._layer_kv[layer].narrow(3, 0, end)  # (2, B, nh, end, hs)
        cached.narrow(3, position, 1).copy_(kv)
        self.last_written = (position, end)
        self.reused[layer] = end - 1
        return cached

    @property
    def positions_held(self) -> int:
        return self.length

    @property
    def layer_positions_held(self) -> tuple[int, ...]:
        """Positions each layer holds, from the bottom layer."""
        return tuple(self._layer_lengths)

    @property
    def bytes_used(self) -> int:
        """Bytes of the K and V rows actually filled, over all layers."""
        per_position = 2 * self.keys[:, :, :, 0].numel() * self.keys.element_size()
        return per_position * self.length

    @property
    def bytes_allocated(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class LateWriteCache(KVCache):
    """The teaching bug of kvviz.core.records.CACHE_FAULTS["late_write"]: each decoded token's key and value
    are written one slot late, so the query at `position` reads whatever that row held before; the prefill
    is written where it belongs. Both writes are broken alike: `append` (a fast path's) and a one-position
    `update` (a teaching forward's)."""

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if k.shape[2] != 1:
            return super().update(layer, positions, k, v)
        position = int(positions[0])
        end = self._claim(layer, position, 1)
        keys, values = self._layer_kv[layer].unbind(0)  # (B, nh, S, hs) each
        if position + 1 < self.capacity:
            keys.narrow(2, position + 1, 1).copy_(k)
            values.narrow(2, position + 1, 1).copy_(v)
        self.last_written = (position + 1, min(position + 2, self.capacity))
        self.reused[layer] = end - 1
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)  # (B, nh, end, hs)

    def append(self, layer: int, position: int, kv: torch.Tensor) -> torch.Tensor:
        end = self._claim(layer, position, 1)
        if position + 1 < self.capacity:
            self._layer_kv[layer].narrow(3, position + 1, 1).copy_(kv)
        self.last_written = (position + 1, min(position + 2, self.capacity))
        self.reused[layer] = end - 1
        return self._layer_kv[layer].narrow(3, 0, end)  # (2, B, nh, end, hs)


class WindowCache(KVCache):
    """A cache that keeps what `policy` says (the first `sinks` positions and the last `window`) in a rolling
    buffer of `sinks + window` slots: its memory stops growing there. A one-token pass writes its key and value
    over the slot of the position that just left the window, and reads every slot; a longer pass (a prefill, or
    a recomputation from scratch) reads what is held and its own rows, masked as `visible` says, then keeps the
    rows the policy keeps. `held[layer]` lists the position each slot holds; `length` counts positions fed."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, policy: CachePolicy, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", width: int = 0) -> None:
        if not policy.evicts:
            raise ValueError("a WindowCache needs a window")
        # layers below policy.first_layer keep every position: their buffers hold the run's `width`
        capacity = max(policy.capacity, width) if policy.first_layer else policy.capacity
        super().__init__(n_layer, n_head, head_dim, capacity, batch_size, dtype, device)
        self.policy = policy
        self.held: list[list[int]] = [[] for _ in range(n_layer)]
        self.key_positions: list[int] = []  # the positions of the keys the latest update returned, in order
        self._window = policy.window  # the window of the layer the latest update was of (a full layer's: all)

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` (B, nh, T, hs) at `positions` (T,) of `layer`; return the keys and values this pass
        reads, (B, nh, S, hs) each, their positions in `key_positions`."""
        T, start = k.shape[2], int(positions[0])
        if start != self._layer_lengths[layer]:
            raise ValueError(f"layer {layer}: positions start at {start} but the cache has seen "
                             f"{self._layer_lengths[layer]}")
        end = self._layer_lengths[layer] = start + T
        if layer == self.n_layer - 1:
            self.length = end
        keys, values = self._layer_kv[layer].unbind(0)  # (B, nh, capacity, hs) each
        window = self.policy.window if self.policy.windows(layer) else self.capacity + end  # a full layer: all
        held, sinks = self.held[layer], self.policy.sinks
        self._window = window
        self.reused[layer] = len(held)
        self.last_written = (start, end)  # positions, not slots: the grid shows where each position's K/V went
        leaving = start - window  # no longer visible to the query at `start`: its slot takes the new rows
        evicting = leaving >= sinks and leaving in held
        if T == 1 and (evicting or len(held) < min(self.capacity, sinks + window)):
            slot = held.index(leaving) if evicting else len(held)
            keys.narrow(2, slot, 1).copy_(k)
            values.narrow(2, slot, 1).copy_(v)
            if slot < len(held):
                held[slot] = start
                self.evicted = (leaving, leaving + 1)
            else:
                held.append(start)
                self.evicted = (start, start)
            self.key_positions = list(held)
            self.reused[layer] = len(held) - 1  # every slot is read; one of them was written now
            return keys.narrow(2, 0, len(held)), values.narrow(2, 0, len(held))  # (B, nh, S, hs)
        n = len(held)
        all_keys = torch.cat((keys.narrow(2, 0, n), k), dim=2)  # (B, nh, n + T, hs): held, then this pass's
        all_values = torch.cat((values.narrow(2, 0, n), v), dim=2)
        self.key_positions = held + list(range(start, end))
        kept = [i for i, p in enumerate(self.key_positions) if p < sinks or p >= end - window]
        dropped = [p for p in self.key_positions if sinks <= p < end - window]
        index = torch.tensor(kept, device=k.device)
        keys.narrow(2, 0, len(kept)).copy_(all_keys.index_select(2, index))
        values.narrow(2, 0, len(kept)).copy_(all_values.index_select(2, index))
        self.held[layer] = [self.key_positions[i] for i in kept]
        self.evicted = (min(dropped), max(dropped) + 1) if dropped else (end, end)
        return all_keys, all_values

    def visible(self, positions: torch.Tensor) -> torch.Tensor:
        """(T, S) True where the query at each of `positions` attends to each key the latest update returned."""
        keys = torch.tensor(self.key_positions, device=positions.device)[None, :]  # (1, S)
        queries = positions[:, None]  # (T, 1)
        return (keys <= queries) & ((keys < self.policy.sinks) | (keys > queries - self._window))

    def sink_keys(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(S,) True for the keys the latest update returned that are attention sinks."""
        return torch.tensor(self.key_positions, device=device) < self.policy.sinks

    def append(self, layer: int, position: int, kv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a WindowCache runs the teaching forward's update, not a fast path's append")

    def reset(self) -> None:
        super().reset()
        self.held = [[] for _ in range(self.n_layer)]

    @property
    def positions_held(self) -> int:
        return len(self.held[-1])

    @property
    def layer_positions_held(self) -> tuple[int, ...]:
        return tuple(len(held) for held in self.held)

    @property
    def bytes_used(self) -> int:
        """Bytes of the K and V rows held, layer by layer: at most `sinks + window` positions in a windowed layer."""
        per_layer_position = 2 * self.keys[0, :, :, 0].numel() * self.keys.element_size()
        return per_layer_position * sum(len(held) for held in self.held)


CACHES_BY_FAULT: dict[str, type[KVCache]] = {"": KVCache, "late_write": LateWriteCache}


class QuantizedCache(KVCache):
    """A cache that stores every key and value quantized (`policy.kv_dtype`: int8, int4 or fp8), per token and
    head: each (head_dim,) vector gets a float32 scale, its largest magnitude over the format's largest value, and
    is stored as round(x / scale) (int8 and int4, two int4 numbers to a byte) or x / scale in float8 e4m3 (fp8).
    A new token never rescales the old ones, so it streams; KIVI's per-channel keys would need a group of tokens
    first. Attention reads the dequantized rows, q * scale, in the model's number type: the cache's output drifts
    from an exact cache's by that rounding, and `bytes_used` counts the stored numbers and their scales."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, capacity: int, policy: CachePolicy,
                 batch_size: int = 1, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        from kvviz.core.records import KV_DTYPES

        if policy.kv_dtype not in KV_DTYPES:
            raise ValueError(f"no quantized cache in {policy.kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
        bits, self.largest = KV_DTYPES[policy.kv_dtype]
        if bits == 4 and head_dim % 2:
            raise ValueError(f"an int4 cache packs two numbers to a byte: head_dim {head_dim} is odd")
        super().__init__(n_layer, n_head, head_dim, 0, batch_size, dtype, device)  # no float rows: see below
        self.capacity, self.policy, self.model_dtype = capacity, policy, dtype
        self.packed = bits == 4
        stored = torch.float8_e4m3fn if policy.kv_dtype == "fp8" else torch.uint8 if self.packed else torch.int8
        width = head_dim // 2 if self.packed else head_dim
        shape = (n_layer, 2, batch_size, n_head, capacity)
        self.codes = torch.zeros((*shape, width), dtype=stored, device=device)  # (L, 2, B, nh, S, hd or hd/2)
        self.scales = torch.zeros((*shape, 1), dtype=torch.float32, device=device)  # (L, 2, B, nh, S, 1)

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes and scales of `x` (..., hd): scales (..., 1) float32, codes in the stored type."""
        x = x.float()
        scale = (x.abs().amax(dim=-1, keepdim=True) / self.largest).clamp_min(1e-12)
        if self.policy.kv_dtype == "fp8":
            return (x / scale).to(torch.float8_e4m3fn), scale
        q = torch.round(x / scale).clamp(-self.largest, self.largest).to(torch.int8)
        if self.packed:  # two numbers a byte: q + 8 in 0..15, even channels in the low half
            q = (q + 8).to(torch.uint8)
            q = q[..., 0::2] | (q[..., 1::2] << 4)
        return q, scale

    def dequantize(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """The rows `codes` with `scales` stand for, (..., hd) in the model's number type."""
        if self.packed:
            low = (codes & 0x0F).to(torch.int8) - 8
            high = (codes >> 4).to(torch.int8) - 8
            codes = torch.stack((low, high), dim=-1).flatten(-2)  # (..., hd): even, odd, even, ...
        return (codes.float() * scales).to(self.model_dtype)

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` (B, nh, T, hs) quantized at `positions` (T,) of `layer`; return every cached K, V
        dequantized, (B, nh, end, hs) each."""
        T = k.shape[2]
        start = int(positions[0])
        end = self._claim(layer, start, T)
        for i, rows in enumerate((k, v)):
            codes, scales = self.quantize(rows)
            self.codes[layer, i].narrow(2, start, T).copy_(codes)
            self.scales[layer, i].narrow(2, start, T).copy_(scales)
        self.last_written = (start, end)
        self.reused[layer] = end - T
        held = self.dequantize(self.codes[layer, :, :, :, :end], self.scales[layer, :, :, :, :end])
        return held[0], held[1]  # (B, nh, end, hs) each

    def append(self, layer: int, position: int, kv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a QuantizedCache runs the teaching forward's update, not a fast path's append")

    @property
    def bytes_used(self) -> int:
        per_position = (self.codes[:, :, :, :, 0].numel() * self.codes.element_size()  # (L, 2, B, nh, hd) codes
                        + self.scales[:, :, :, :, 0].numel() * self.scales.element_size())  # and their scales
        return per_position * self.length

    @property
    def bytes_allocated(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()


class LatentCache(KVCache):
    """Multi-head latent attention's cache (kvviz.models.deepseek): per layer and position one latent `c_kv` of
    `rank` numbers and one RoPE key `k_pe` of `rope_dim`, shared by every head, in a buffer shaped (layers, batch,
    capacity, rank + rope_dim); each head's keys and values are rebuilt from it. `bytes_used` counts the filled
    rows: layers x (rank + rope_dim) x bytes per number a position."""

    def __init__(self, n_layer: int, rank: int, rope_dim: int, capacity: int, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__(n_layer, 1, 0, 0, batch_size, dtype, device)  # no per-head rows: see `latents`
        self.capacity, self.rank = capacity, rank
        self.latents = torch.zeros((n_layer, batch_size, capacity, rank + rope_dim), dtype=dtype,
                                   device=device)  # (L, B, S, r + rope)

    def update(self, layer: int, positions: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `c_kv` (B, T, r) and `k_pe` (B, T, rope) at `positions` (T,) of `layer`; return every cached
        latent and RoPE key, (B, S, r) and (B, S, rope)."""
        T = c_kv.shape[1]
        start = int(positions[0])
        end = self._claim(layer, start, T)
        rows = self.latents[layer].narrow(1, start, T)  # (B, T, r + rope)
        rows[..., : self.rank].copy_(c_kv)
        rows[..., self.rank:].copy_(k_pe)
        self.last_written = (start, end)
        self.reused[layer] = end - T
        held = self.latents[layer].narrow(1, 0, end)  # (B, S, r + rope)
        return held[..., : self.rank], held[..., self.rank:]

    def append(self, layer: int, position: int, kv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a LatentCache runs the teaching forward's update")

    @property
    def bytes_used(self) -> int:
        return self.latents[:, :, 0].numel() * self.latents.element_size() * self.length

    @property
    def bytes_allocated(self) -> int:
        return self.latents.numel() * self.latents.element_size()
