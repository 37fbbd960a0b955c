"""The products every GPT layer and decode step multiplies by on CPU: float32 as column blocks spread over
torch's threads, bfloat16 on oneDNN's packed copies of the weights, everything else one addmm.

The model files call `linear` and `tied_head`; how a product runs fast is decided here, and the teaching
forward and the fast decode step take the same products, so they round alike.
"""

from __future__ import annotations

import weakref

import torch

PROJECTION_CHUNKS = 8  # output column blocks of a float32 product on CPU, spread over torch's threads


def pack_for_cpu(rows_major: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a bfloat16 (out, in) weight on a CPU that multiplies bfloat16, else None.

    oneDNN multiplies bfloat16 in pairs laid out in blocks; given a plain matrix it reorders the
    blocks at every call, and a one-row product then runs at about half the memory rate.
    """
    if rows_major.dtype != torch.bfloat16 or rows_major.device.type != "cpu" or not _cpu_packs_bfloat16():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(rows_major.detach().contiguous(), 1)


_PACKS_BFLOAT16: list[bool] = []


def _cpu_packs_bfloat16() -> bool:
    if not _PACKS_BFLOAT16:
        try:
            _PACKS_BFLOAT16.append(bool(torch.backends.mkldnn.is_available()
                                        and torch.ops.mkldnn._is_mkldnn_bf16_supported()))
        except (AttributeError, RuntimeError):
            _PACKS_BFLOAT16.append(False)
    return _PACKS_BFLOAT16[0]


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            packed: torch.Tensor | None = None) -> torch.Tensor:
    """`x` (M, in) @ `weight` (in, out) + `bias`: the product of every Conv1D, decode step and head.

    - `packed` (from `pack_for_cpu`, bfloat16): one oneDNN product on the packed copy.
    - A float32 weight stored column-major (see `column_major`) on CPU: PROJECTION_CHUNKS blocks
      of output columns in one batched product; torch runs a single (1, in) @ (in, out) product
      on one thread, but spreads a batch over all of them.
    - Else one `addmm`.
    Forward and decode both come here with the same arguments, so they round alike.
    """
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # (M, out)
    rows_major = weight.t()  # (out, in)
    out_features = rows_major.shape[0]
    if (x.dtype != torch.float32 or x.device.type != "cpu" or out_features % PROJECTION_CHUNKS
            or not rows_major.is_contiguous()):
        return x @ weight if bias is None else torch.addmm(bias, x, weight)  # (M, out)
    k, M = PROJECTION_CHUNKS, x.shape[0]
    blocks = rows_major.view(k, out_features // k, -1).transpose(1, 2)  # (k, in, out/k)
    x_k = x.expand(k, *x.shape)  # (k, M, in)
    y = torch.bmm(x_k, blocks) if bias is None else torch.baddbmm(bias.view(k, 1, -1), x_k, blocks)  # (k, M, out/k)
    return y.view(M, out_features) if M == 1 else y.transpose(0, 1).reshape(M, out_features)


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (V, C) with the same values, stored column by column: its transpose is then a contiguous
    (C, V) matrix without a copy. GPT keeps `wte` and every Conv1D weight this way, so that the tied head,
    `x @ wte.T`, multiplies by a contiguous matrix (twice as fast on CPU as by the transposed view) while
    sharing the embedding's memory, and the float32 product spreads a Conv1D's row blocks over threads."""
    return weight.t().contiguous().t()


# id(parameter) -> (the version it was packed from, its packed copy); an entry goes with its parameter
_PACKED: dict[int, tuple[tuple, torch.Tensor | None]] = {}


def packed_copy(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of `weight` (in, out) for inference (see `pack_for_cpu`), made once per version of
    the parameter it views, or None where packing does not apply."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not _cpu_packs_bfloat16():
        return None
    owner = weight if weight._base is None else weight._base
    rows_major = weight.t()  # (out, in)
    key = (rows_major.data_ptr(), owner._version, tuple(rows_major.shape), rows_major.stride())
    kept = _PACKED.get(id(owner))
    if kept is None or kept[0] != key:
        if kept is None:
            weakref.finalize(owner, _PACKED.pop, id(owner), None)
        kept = (key, pack_for_cpu(rows_major))
        _PACKED[id(owner)] = kept
    return kept[1]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x` (..., in) @ `weight` (in, out) + `bias`: a Conv1D's product, on the packed copy in inference."""
    packed = None if torch.is_grad_enabled() else packed_copy(weight)
    flat = x.reshape(-1, x.shape[-1])  # (M, in)
    return project(flat, weight, bias, packed).view(*x.shape[:-1], weight.shape[1])  # (..., out)


class Linear(torch.nn.Linear):
    """`nn.Linear` (its (out, in) weight, its state-dict keys) whose product is `linear`'s: column blocks over
    torch's threads in float32, the packed copy in bfloat16; what the Llama family's projections are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight.t(), self.bias)  # x @ weightᵀ + bias


def tied_head(x: torch.Tensor, wte: torch.Tensor) -> torch.Tensor:
    """Logits `x` (M, C) @ `wte` (V, C)ᵀ: the output head that shares the token embedding."""
    if torch.is_grad_enabled():
        return torch.nn.functional.linear(x, wte)  # (M, V)
    packed = packed_copy(wte.t())
    if packed is not None:
        return project(x, wte.t(), None, packed)  # (M, V)
    weight = wte.detach().t()  # (C, V)
    if weight.is_contiguous() and x.dtype == torch.float32 and x.device.type == "cpu":
        return _column_blocks(x, weight)  # (M, V): rows against a column-major wte (GPT-2's), in column blocks
        # over the threads: for one row, 5.2 against 6.8 ms for GPT-2's head as one product, which torch runs on
        # one thread (medians of 21, 2-core CPU; 11% of a whole decode step, in turns)
    return project(x, weight, None)  # (M, V): column blocks of a row-major wte (the Llama family's)


# id(parameter) -> (the version it was copied from, its copy stored row by row); an entry goes with its parameter
_ROWS: dict[int, tuple[tuple, torch.Tensor]] = {}


def rows_copy(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (V, C) stored row by row: itself where it is, else a copy made once per version of the parameter (a
    GPT's column-major `wte`: 38.6 MB more for the embedded model, made by its first verifying pass)."""
    if weight.is_contiguous():
        return weight.detach()
    key = (weight.data_ptr(), weight._version, tuple(weight.shape), weight.stride())
    kept = _ROWS.get(id(weight))
    if kept is None or kept[0] != key:
        if kept is None:
            weakref.finalize(weight, _ROWS.pop, id(weight), None)
        kept = (key, weight.detach().contiguous())
        _ROWS[id(weight)] = kept
    return kept[1]


def verifying_head(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits `x` (M, C) @ `weight` (V, C)ᵀ for a pass that needs every row's (speculative decoding's verifying
    pass), as the product of the (V, C) matrix, stored row by row, by xᵀ: on this 2-core CPU the embedded model's
    head takes 2.1 ms for 5 rows this way against 3.5 ms for tied_head's short, wide product and 1.3 ms for one row
    (medians of 60). One row, a bfloat16 head or gradients go to tied_head."""
    if (x.shape[0] == 1 or torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu"
            or packed_copy(weight.t()) is not None):
        return tied_head(x, weight)
    return torch.mm(rows_copy(weight), x.t()).t()  # (M, V)


def _column_blocks(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x` (M, in) @ `weight` (in, out), contiguous, as PROJECTION_CHUNKS products of column blocks and one for
    the columns left over: at a few rows, 2-3 times faster on CPU than one product of a short, wide matrix."""
    M, (n_in, out_features) = x.shape[0], weight.shape
    k = PROJECTION_CHUNKS
    width = out_features // k
    main = k * width
    blocks = weight[:, :main].view(n_in, k, width).transpose(0, 1)  # (k, in, out/k), views
    y = torch.bmm(x.expand(k, *x.shape), blocks).transpose(0, 1).reshape(M, main)  # (M, main)
    return y if main == out_features else torch.cat((y, x @ weight[:, main:]), dim=1)  # (M, out)
