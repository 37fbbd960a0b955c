"""The products every GPT layer and decode step multiplies by on CPU: float32 as column blocks spread over
torch's threads, bfloat16 on oneDNN's packed copies of the weights, everything else one addmm."""

from __future__ import annotations

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
    - A float32 weight stored column-major (see `kvviz.models.gpt2.column_major`) on CPU: PROJECTION_CHUNKS blocks
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


class InferenceCopy:
    """A packed copy of one weight for inference (see `pack_for_cpu`), rebuilt when the weight changes."""

    def __init__(self) -> None:
        self._packed: torch.Tensor | None = None
        self._key: tuple | None = None

    def of(self, rows_major: torch.Tensor) -> torch.Tensor | None:
        """The packed copy of `rows_major` (out, in), or None where packing does not apply."""
        key = (rows_major.data_ptr(), rows_major._version, rows_major.dtype, tuple(rows_major.shape))
        if key != self._key:
            self._packed, self._key = pack_for_cpu(rows_major), key
        return self._packed

    def release(self) -> None:
        self._packed = self._key = None
