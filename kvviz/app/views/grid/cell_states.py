"""What each cell of the K/V grid shows, and what each row is: Qt-free names the grid's state and its
painting share."""

from __future__ import annotations

# Cell states, the values of `KVGridView.cell_states()`.
EMPTY = 0  # the position does not exist yet
PENDING = 1  # the token exists, its K/V has not been computed yet
COMPUTED = 2  # K/V computed in this pass (amber)
REUSED = 3  # K/V read from the cache in this pass (teal)
STALE = 4  # read in this pass but never written by it: its K/V went one slot late (a cache broken on purpose)
EVICTED = 5  # dropped from the cache by its window: no later pass reads it
SHARED = 6  # a layer that keeps no K/V of its own: it reads an earlier layer's (cross-layer KV sharing)
STATE = 7  # a linear-attention layer's fixed-size state, which every position's K/V is folded into
# speculative decoding, at the record of a round: the drafts fed after the pending token (itself COMPUTED)
DRAFTED = 8  # a draft the target accepted: its K/V computed in this pass and kept (reused, teal, from the next)
ROLLED_BACK = 9  # a draft the target rejected: its K/V computed in this pass, then cropped (struck through, one step)

STATE_NAMES = {
    EMPTY: "not generated yet",
    PENDING: "token without K/V yet",
    COMPUTED: "K/V computed this step",
    REUSED: "K/V reused from the cache",
    STALE: "stale slot: this token's K/V went one slot late",
    EVICTED: "K/V evicted: outside the window",
    SHARED: "no K/V of its own: reads an earlier layer's",
    STATE: "fixed-size state: each K/V folded in, none kept",
    DRAFTED: "draft accepted: K/V computed this step, kept",
    ROLLED_BACK: "draft rejected: K/V rolled back (struck through for one step)",
}
# A latent cache (MLA) keeps a latent and a RoPE key a position, not K and V: every pass rebuilds each head's K and
# V from the latent, so what a pass computes or reuses is the latent.
LATENT_STATE_NAMES = {
    **STATE_NAMES,
    PENDING: "token without its latent yet",
    COMPUTED: "latent computed this step",
    REUSED: "latent reused from the cache (each head's K/V rebuilt from it)",
    DRAFTED: "draft accepted: latent computed this step, kept",
    ROLLED_BACK: "draft rejected: latent rolled back (struck through for one step)",
}


def state_names(latent: bool, method: str = "") -> dict[int, str]:
    """The cell states' names: of a cache of K and V, or of latent attention's cache of latents (`latent`); a run
    that evicts by importance names its `method` ("H2O") for the evicted cells, not a window."""
    names = LATENT_STATE_NAMES if latent else STATE_NAMES
    return {**names, EVICTED: f"K/V evicted: {method} dropped it"} if method else names

# What a row of the grid shows, for its cells' separators.
LAYER_ROW = 0  # a layer: the usual gap below it
HEAD_ROW = 1  # an expanded layer's row or one of its heads: a soft 1 px line below it, so they read as one band
LAST_HEAD_ROW = 2  # the last head of an expanded layer, or the row above one: a wide gap parts the layers
INNER_ROW = 3  # a row inside a part drawn several rows tall (a latent beside its RoPE key): no line below it
ROW_KINDS = (LAYER_ROW, HEAD_ROW, LAST_HEAD_ROW, INNER_ROW)
