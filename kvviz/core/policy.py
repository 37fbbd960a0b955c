"""Which positions a run's cache keeps: all of them, a window with sinks, or those an importance method keeps within
a budget (H2O, TOVA, SnapKV, PyramidKV), and in what number type. Torch-free and Qt-free."""

from __future__ import annotations

from dataclasses import dataclass

EVICTION_METHODS = {  # the importance methods, by the name the CLI and the app take, with their published rules
    "h2o": "H2O: the heavy hitters (the largest attention accumulated over every query so far) and the most recent "
           "half of the budget",
    "tova": "TOVA: drops the position the newest query attends to least, its weights averaged over the heads",
    "snapkv": "SnapKV: the positions an observation window of the latest queries attends to most, pooled, and the "
              "window itself",
    "pyramidkv": "PyramidKV: SnapKV's rule under a budget that shrinks with depth (the same total)",
}
PER_HEAD = ("h2o", "snapkv", "pyramidkv")  # methods that choose for each KV head apart (TOVA: a layer at once)
SNAP_METHODS = ("snapkv", "pyramidkv")  # methods with an observation window and pooling
PYRAMID_BETA = 20  # PyramidKV's: the top layer keeps 1/β of the average budget past the observation window


@dataclass(frozen=True)
class CachePolicy:
    """Which positions a cache keeps: every one (`window` 0, no `evict`); the first `sinks` ever fed and the last
    `window` (a sliding window, as Mistral's; with sinks, StreamingLLM's attention sinks); or `budget` positions a
    layer chosen by what attention says matters (`evict`, a key of EVICTION_METHODS; SnapKV and PyramidKV watch
    the last `observe` queries and pool their scores over `pool` neighbouring positions). A query attends to
    exactly the positions the cache holds as it runs. `kv_dtype` (a key of KV_DTYPES) stores every key and value
    quantized, with a scale each ("": in the weights' number type); `kv_layout` "kivi" scales the keys per channel
    instead, over groups of `kv_residual` tokens, the latest keys short of a group held exact (KIVI)."""

    window: int = 0
    sinks: int = 0
    kv_dtype: str = ""
    first_layer: int = 0  # layers below it keep every position (Qwen2's max_window_layers); the window is above
    evict: str = ""  # an importance method (a key of EVICTION_METHODS), or "" (none)
    budget: int = 0  # with `evict`: positions a layer keeps (PyramidKV: on average over the layers)
    observe: int = 0  # with SnapKV or PyramidKV: the latest queries whose attention decides (its window)
    pool: int = 0  # ... and the width of the average pooling of their scores over positions
    kv_layout: str = ""  # with `kv_dtype` int8 or int4: "kivi" (keys per channel, values per token), or "" (per token)
    kv_residual: int = 0  # with "kivi": the tokens of a group of keys, and the most held exact before it is full

    @property
    def evicts(self) -> bool:
        """The cache drops positions: a window, or an importance method."""
        return self.window > 0 or bool(self.evict)

    @property
    def importance(self) -> bool:
        """Positions are dropped by the attention they get (an importance method), not by their place."""
        return bool(self.evict)

    @property
    def quantized(self) -> bool:
        return bool(self.kv_dtype)

    @property
    def lossy(self) -> bool:
        """The cache changes what the model attends to (evicting or rounding): its output may part from an exact
        cache's, by design."""
        return self.evicts or self.quantized

    @property
    def capacity(self) -> int:
        """The most positions a windowed layer holds at once: sinks + window; an importance method's budget (0: no
        bound)."""
        return self.sinks + self.window if self.window else self.budget

    def windows(self, layer: int) -> bool:
        """Whether `layer` keeps a sliding window (every layer does, but those below `first_layer`)."""
        return self.window > 0 and layer >= self.first_layer

    def layer_budget(self, layer: int, n_layer: int) -> int:
        """Positions `layer` keeps under an importance method: the budget, or PyramidKV's share of it (more below,
        fewer above, the observation window in every layer; PyramidKV's linear steps, from 2·C - C/β at the bottom
        to C/β at the top, C the budget past the window)."""
        if self.evict != "pyramidkv" or n_layer == 1:
            return self.budget
        past = self.budget - self.observe  # C
        least = past / PYRAMID_BETA
        most = 2 * past - least
        return self.observe + max(0, round(most - layer * (most - least) / (n_layer - 1)))

    def describe(self) -> str:
        if self.quantized and self.kv_layout == "kivi":
            return (f"every position, in {self.kv_dtype}: keys per channel in groups of {self.kv_residual} tokens "
                    "(KIVI), values per token")
        if self.quantized:
            return f"every position, in {self.kv_dtype}"
        if self.importance:
            watch = f", watching the last {self.observe} queries, pooled over {self.pool}" if self.observe else ""
            average = " on average" if self.evict == "pyramidkv" else ""
            return f"{self.budget} positions a layer{average}, chosen by {self.method_name}{watch}"
        if not self.evicts:
            return "every position"
        sinks = f"the first {self.sinks} and " if self.sinks else ""
        layers = f" in layers {self.first_layer} and above (every position below)" if self.first_layer else ""
        return f"{sinks}the last {self.window} positions{layers}"

    @property
    def method_name(self) -> str:
        """The importance method as its paper writes it: "H2O", "TOVA", "SnapKV", "PyramidKV" ("" for none)."""
        return EVICTION_METHODS[self.evict].split(":")[0] if self.evict else ""


EXACT = CachePolicy()
