"""Eviction by importance: a layer keeps `budget` positions a KV head, chosen by the attention the model really
computed (H2O, TOVA, SnapKV, PyramidKV: kvviz.core.policy.EVICTION_METHODS).

The choice lives in a `Keeper`, apart from the keys and values, so that the cached layer (`ImportanceLayer`, which
keeps the rows its keeper keeps) and an uncached pass (`ReplayLayer`, which feeds the whole text again and masks
each query to what the keeper held when that query came) decide alike: cached equals uncached, as with a window.

After a pass, a keeper scores each position its layer holds, per KV head (the mean of its query heads' weights):
- H2O adds every query's weight to each position's score (accumulated attention) and keeps the most recent half
  of the budget whatever their scores;
- TOVA scores each position by the newest query's weight, averaged over every head, so a layer keeps the same
  positions in all its heads;
- SnapKV (and PyramidKV) sums the weights of the latest `observe` queries (the observation window), averages
  them over `pool` neighbouring positions, and keeps the window's own positions whatever their scores.
It then keeps the `budget` best-scored positions of each head; equal scores keep the later position.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn.functional as F

from kvviz.cache.layers import Held, LayerCache, LayerKind, PassLayer
from kvviz.core.eviction import EvictionState, LayerEviction

SCORES = {"h2o": "accumulated attention", "tova": "newest query's attention", "snapkv": "observed attention, pooled",
          "pyramidkv": "observed attention, pooled"}  # what a method's scores are, for tooltips and tables


class Keeper:
    """One layer's choice of positions under `method`: `held` (heads, n) the positions each KV head holds, in
    order; `scores` (heads, capacity) each position's latest score (a dropped one's as it was then); `evicted_in`
    (heads, capacity) the pass that dropped it (-1: never)."""

    def __init__(self, method: str, budget: int, heads: int, capacity: int, observe: int = 0, pool: int = 0,
                 device: torch.device | str = "cpu") -> None:
        if budget <= 0:
            raise ValueError(f"an importance method keeps at least one position, got a budget of {budget}")
        self.method, self.budget, self.heads, self.observe, self.pool = method, budget, heads, observe, pool
        self.held = torch.empty(heads, 0, dtype=torch.long, device=device)
        self.scores = torch.zeros(heads, capacity, dtype=torch.float32, device=device)
        self.evicted_in = torch.full((heads, capacity), -1, dtype=torch.long, device=device)
        self.window_rows: deque[torch.Tensor] = deque(maxlen=max(observe, 1))  # (heads, capacity) a query each
        self.passes = 0  # passes decided so far: the next one's index
        self.fed = 0  # positions fed so far

    def decide(self, weights: torch.Tensor, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """After a pass whose queries at `queries` (T,) gave `weights` (heads, T, S) to keys at `keys` (heads, S),
        score the keys and keep at most `budget` of them a head: their indices into S (heads, n), in order."""
        heads, T, S = weights.shape
        newest = int(queries[-1])
        by_position = weights.new_zeros(heads, T, self.scores.shape[1]).scatter_(
            2, keys[:, None, :].expand(heads, T, S), weights)  # (heads, T, capacity)
        protected = self._score(by_position, keys, newest)  # (heads, S): kept whatever their scores
        key_scores = self.scores.gather(1, keys).masked_fill(protected, float("inf"))  # (heads, S)
        if S > self.budget:
            later_first = key_scores.flip(1)  # equal scores: the later position ranks first (a stable sort)
            order = torch.sort(later_first, dim=1, descending=True, stable=True).indices[:, :self.budget]
            kept = torch.sort(S - 1 - order, dim=1).values  # (heads, budget) indices into S, in order
            dropped = torch.ones_like(keys, dtype=torch.bool).scatter_(1, kept, False)
            self.evicted_in.scatter_(1, keys, torch.where(dropped, self.passes, self.evicted_in.gather(1, keys)))
        else:
            kept = torch.arange(S, device=keys.device).expand(heads, S)
        self.held = keys.gather(1, kept)
        self.passes += 1
        self.fed = newest + 1
        return kept

    def _score(self, by_position: torch.Tensor, keys: torch.Tensor, newest: int) -> torch.Tensor:
        """Update the scores of the pass's keys from their weights by position (heads, T, capacity); which keys
        the method keeps whatever their scores (heads, S)."""
        present = torch.zeros_like(self.scores, dtype=torch.bool).scatter_(1, keys, True)  # (heads, capacity)
        if self.method == "h2o":  # every query's weight, accumulated
            self.scores += by_position.sum(1)
            return keys > newest - self.budget // 2
        if self.method == "tova":  # the newest query's, averaged over the heads: one choice a layer
            latest = by_position[:, -1].mean(0, keepdim=True).expand_as(self.scores)
            self.scores = torch.where(present, latest, self.scores)
            return torch.zeros_like(keys, dtype=torch.bool)
        self.window_rows.extend(by_position.unbind(1))  # SnapKV, PyramidKV: the observation window's queries
        observed = torch.stack(tuple(self.window_rows)).sum(0)  # (heads, capacity)
        first_watched = newest - self.observe + 1  # the window's own positions are kept whatever they score
        before = observed[:, :max(first_watched, 0)]  # (heads, first_watched): the positions the window judges
        pooled = F.avg_pool1d(before[:, None], self.pool, stride=1, padding=self.pool // 2)[:, 0] if \
            before.shape[1] else before  # SnapKV's pooling: neighbours' scores count, zeros past either end
        judged = torch.cat((pooled[:, :before.shape[1]], observed[:, before.shape[1]:]), dim=1)
        self.scores = torch.where(present, judged, self.scores)
        return keys >= first_watched

    def state(self, fed: int) -> LayerEviction:
        """What the layer holds and has dropped, for positions 0 .. fed - 1."""
        held = torch.zeros(self.heads, fed, dtype=torch.bool, device=self.held.device)
        held.scatter_(1, self.held.clamp(max=fed - 1), self.held < fed)
        heads = held.sum(0)
        gone = torch.where(heads == 0, self.evicted_in[:, :fed].max(0).values, -1)
        return LayerEviction(tuple(heads.tolist()), tuple(self.scores[:, :fed].mean(0).tolist()), tuple(gone.tolist()),
                             self.budget)


def keep_attention(keeper: Keeper, scores: torch.Tensor, keys: torch.Tensor,
                   queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax weights (nh, T, S) of `scores` (nh, T, S) for queries at `queries` over keys at `keys` (heads, S),
    each query seeing the keys at or before it; then `keeper` decides on them (its query heads' mean a KV head)."""
    group = scores.shape[0] // keys.shape[0]
    seen = (keys[:, None, :] <= queries[None, :, None]).repeat_interleave(group, 0)  # (nh, T, S)
    weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return weights, keeper.decide(weights.view(keys.shape[0], group, *weights.shape[1:]).mean(1), keys, queries)


class ImportanceLayer(LayerCache):
    """A cached layer under an importance method: it holds at most `budget` positions a KV head, each head its own
    (TOVA: the same in all), in a buffer of `budget` slots, so its memory stops growing there. A pass attends to
    what it holds and to its own rows; then its keeper keeps the best, and the layer keeps their rows."""

    def __init__(self, heads: int, head_dim: int, keeper: Keeper, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if batch_size != 1:
            raise ValueError("an importance method keeps positions for one sequence, not a batch")
        super().__init__()
        self.keeper = keeper
        self.slots = keeper.budget
        self.kv = torch.zeros((2, 1, heads, keeper.budget, head_dim), dtype=dtype, device=device)
        self._pass: tuple[torch.Tensor, torch.Tensor] | None = None  # this pass's keys and values, until decided

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        T = k.shape[2]
        start = positions if isinstance(positions, int) else int(positions[0])
        if start != self.length:
            raise ValueError(f"positions start at {start} but the layer has seen {self.length}")
        n = self.keeper.held.shape[1]
        self.length, self.reused, self.last_written = start + T, n, (start, start + T)
        keys = torch.cat((self.kv[0].narrow(2, 0, n), k), dim=2)  # (1, h, n + T, d): held, then this pass's
        values = torch.cat((self.kv[1].narrow(2, 0, n), v), dim=2)
        new = torch.arange(start, start + T, device=k.device).expand(k.shape[1], T)
        self._pass = keys, values
        return Held(keys, values, torch.cat((self.keeper.held, new), dim=1), keeper=self)

    def attend(self, scores: torch.Tensor, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """The pass's weights (nh, T, S); the layer then keeps the rows its keeper keeps."""
        weights, kept = keep_attention(self.keeper, scores, keys, queries)
        k, v = self._pass
        index = kept[None, :, :, None].expand(1, *kept.shape, k.shape[-1])  # (1, h, n, d)
        self.kv[0].narrow(2, 0, kept.shape[1]).copy_(k.gather(2, index))
        self.kv[1].narrow(2, 0, kept.shape[1]).copy_(v.gather(2, index))
        gone = self.keeper.evicted_in.gather(1, keys) == self.keeper.passes - 1  # (h, S): dropped now
        dropped = keys[gone]
        self.evicted = (int(dropped.min()), int(dropped.max()) + 1) if dropped.numel() else (self.length, self.length)
        self._pass = None
        return weights

    def crop(self, position: int) -> None:
        raise ValueError("an importance method forgets positions by the attention they got: it cannot roll back")

    @property
    def positions_held(self) -> int:
        return self.keeper.held.shape[1]

    @property
    def bytes_held(self) -> int:
        held = self.kv.narrow(3, 0, self.positions_held)  # (2, 1, h, held, d)
        return held.numel() * held.element_size()

    @property
    def bytes_allocated(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def eviction(self) -> LayerEviction:
        return self.keeper.state(self.length)


class ReplayLayer(PassLayer):
    """An uncached pass under an importance method: it keeps nothing, and each pass feeds the text from position 0
    again; its queries see what a cached run's keeper held when each came. The first `prefill` positions came
    in one pass (the prompt), then one a pass, so a fresh keeper replays the cached run's choices in that order."""

    def __init__(self, kind: LayerKind, prefill: int) -> None:
        super().__init__()
        self.kind, self.prefill = kind, prefill
        self.keeper: Keeper | None = None

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        T = k.shape[2]
        self.length, self.reused, self.last_written = T, 0, (0, T)
        kind = self.kind
        self.keeper = Keeper(kind.evict, kind.budget, kind.heads, T, kind.observe, kind.pool, k.device)
        return Held(k, v, torch.arange(T, device=k.device).expand(k.shape[1], T), keeper=self)

    def attend(self, scores: torch.Tensor, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """Weights (nh, T, S): the prompt's queries causally, then each later query over what the keeper held."""
        P, T = min(self.prefill, scores.shape[1]), scores.shape[1]
        group = scores.shape[0] // keys.shape[0]
        weights = scores.new_zeros(scores.shape)
        weights[:, :P, :P], _ = keep_attention(self.keeper, scores[:, :P, :P], keys[:, :P], queries[:P])
        for t in range(P, T):
            seen = torch.cat((self.keeper.held, keys[:, t:t + 1]), dim=1)  # (h, n + 1): as a cached pass sees them
            row = scores[:, t:t + 1].gather(2, seen.repeat_interleave(group, 0)[:, None, :])  # (nh, 1, n + 1)
            w, _ = keep_attention(self.keeper, row, seen, queries[t:t + 1])
            weights[:, t:t + 1].scatter_(2, seen.repeat_interleave(group, 0)[:, None, :], w)
        return weights

    def eviction(self) -> LayerEviction:
        return self.keeper.state(self.length)


def eviction_state(method: str, kv_heads: int, layers: list[LayerCache]) -> EvictionState | None:
    """Every layer's eviction after the latest pass, where the layers keep by importance; else None."""
    if not layers or not all(isinstance(layer, (ImportanceLayer, ReplayLayer)) for layer in layers):
        return None
    return EvictionState(method, SCORES[method], kv_heads, tuple(layer.eviction() for layer in layers))
