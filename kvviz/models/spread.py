"""The fast file of the families that have none of their own (Gemma 3, Gemma 4, gpt-oss, Qwen3.5): their teaching
forward as it is, each `nn.Linear`'s product taken by `products.project` for the length of a pass.

On a CPU, torch runs a one-row product `(1, in) @ (in, out)` on one thread; a decode step is such products, so it
leaves every other core idle. `project` splits the output columns into blocks and runs them as one batched product,
which torch spreads over its threads (and takes oneDNN's packed copy of a bfloat16 weight). Nothing else of the
teaching file changes, so the fast runs are the teaching runs with their products summed in another order: the
tests check the tokens and the logits against the teaching forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn

from kvviz.cache.kv_cache import KVCache
from kvviz.cache.probe import PassProbe
from kvviz.models.products import packed_copy, project


class Spread(NamedTuple):
    """One `nn.Linear` and its product's tensors: the (in, out) weight (a view of the (out, in) one), its bias,
    its packed copy or None."""

    module: nn.Linear
    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (M, in)
        return project(flat, self.weight, self.bias, self.packed).view(*x.shape[:-1], self.weight.shape[1])


def decode_weights(model: nn.Module) -> list[Spread]:
    """Every `nn.Linear` of `model` with its product's tensors, gathered once per run."""
    spreads = []
    for module in model.modules():
        if type(module) is nn.Linear:
            weight = module.weight.detach().t()  # (in, out)
            spreads.append(Spread(module, weight, module.bias, packed_copy(weight)))
    return spreads


@contextmanager
def spread_products(weights: list[Spread]) -> Iterator[None]:
    """For the length of a pass, each module of `weights` multiplies through `project` (an instance's `forward`
    comes before its class's); afterwards, as it was."""
    for spread in weights:
        spread.module.forward = spread
    try:
        yield
    finally:
        for spread in weights:
            del spread.module.forward


def forward(model: nn.Module, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
            weights: list[Spread] | None = None, probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (B, V) of the last position of each row of `idx` (B, T): the teaching forward's, its products spread."""
    with spread_products(weights if weights is not None else decode_weights(model)):
        return model(idx, positions, kv_cache, last_only=True, probe=probe)[:, -1]


def decode_one(model: nn.Module, token: int, position: int, kv_cache: KVCache, weights: list[Spread] | None = None,
               probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (1, V) for one token of a single sequence at `position`, attending to the cache."""
    device = next(model.parameters()).device
    idx = torch.tensor([[token]], device=device)
    return forward(model, idx, torch.tensor([position], device=device), kv_cache, weights, probe)
