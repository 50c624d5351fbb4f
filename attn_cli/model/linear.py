"""Decoding with weights packed for MKL's matrix product.

A decoding step multiplies a few rows (1 to a few hundred) by every weight matrix of the decoder,
whose weights are far larger than a core's caches, so the products are bound by how fast the
kernel streams each weight in. MKL can pack a matrix once into the panel order its kernel reads
(`cblas_sgemm_pack`), and PyTorch exposes that for linear layers
(`torch.ops.mkl._mkl_reorder_linear_weight` and `torch.ops.mkl._mkl_linear`, which inductor uses
for frozen CPU models). `python scripts/bench_decode.py --weight-layout` times one decoding step's
matrix products with nn.Linear's stored (out, in) weights, with contiguous (in, out) copies (what
attn used before) and with packed copies, cycling through all the weights so that they come from
memory, not from a core's cache. On 2 threads, over the whole step, in two runs, the packed copies
were, against the faster of the other two, at the small (d_model 256) / base (512) size:
  - 1 row:      0.98-1.15x / 1.02-1.36x    (greedy, batch 1)
  - 2-3 rows:   0.88-1.06x / 0.94-1.20x, within the noise: attn's own path, the same packed
                product, took from 0.83x to 1.04x the time of the packed column in one run
  - 5-8 rows:   1.01-1.48x / 1.12-1.37x    (beam 5, batch 1: 5 rows)
  - 16-32 rows: 1.22-1.52x / 1.22-1.55x    (greedy, batch 32: 32 rows)
  - 160 rows:   1.12-1.13x / 1.16-1.17x    (beam 5, batch 32)
  - 640 rows:   1.02-1.03x / 1.02-1.08x
  - 2,048 rows: 0.96-0.97x / 0.98x, so above `PACKED_MAX_ROWS` rows (an encoder batch in
                `attn translate`, say) the layers multiply by their stored weights.
`python scripts/bench_decode.py --packing-ablation` times whole searches with and without them.

MKL packs for a row count (`PACKED_FOR_ROWS`); in one-off timings of packing for 1, 5, 32, 160,
1,024 and 4,096 rows, 160 was the fastest, or within noise of it, at every row count tried (1 to
4,000). PyTorch's op uses a packed copy only when called with the row count it names, and falls
back to the plain product otherwise; `linear` names the actual row count, so one copy serves all
of them. That relies on MKL keeping its blocking in the packed buffer, which it does not
document (the buffer's size is the same for every row count, but the rounding can differ with
the count packed for), so `mkl_packing_available` checks the products once per process before
packing is used, and the tests check them against `F.linear` at row counts from 1 to 1,025.

So inside `inference_weights(model)`, which the searches enter, every `InferenceCopies` module
(each `Linear`, and the Transformer for its output matrix) multiplies by a packed copy of its
weight. The copies are kept between searches and remade when a weight changes: in place (its
version counter moves), or when it is replaced by another tensor (each copy keeps the tensor it
packed, so a new one cannot reuse its address unseen), moved or cast, or the module is loaded or
put back into training. An edit that bypasses the version counter (through `.data`, or a fused
optimizer) in eval mode is not seen; attn's trainer steps its fused AdamW in training mode, which
drops the copies. Outside the context, on GPUs, under autocast, for weights
that are not float32, and where PyTorch was built without MKL, the modules use their weights as
they are. Parameters and checkpoints are those of `nn.Linear`.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

PACKED_FOR_ROWS = 160  # the row count MKL packs for (see above)
PACKED_MAX_ROWS = 1024  # above this many rows the stored weights are as fast


@functools.lru_cache(maxsize=None)
def mkl_packing_available() -> bool:
    """Whether this PyTorch can pack weights for MKL (x86 builds ship MKL, others may not), and a
    copy packed for PACKED_FOR_ROWS rows multiplies other row counts right, checked once."""
    try:
        pack, multiply = torch.ops.mkl._mkl_reorder_linear_weight, torch.ops.mkl._mkl_linear
    except (AttributeError, RuntimeError):
        return False
    if not torch.backends.mkl.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 80, generator=generator)
    with torch.no_grad():
        packed = pack(weight, PACKED_FOR_ROWS)
        for rows in (1, 5, 33, PACKED_FOR_ROWS):
            x = torch.randn(rows, 80, generator=generator)
            if not torch.allclose(multiply(x, packed, weight, None, rows), x @ weight.t(), rtol=1e-4, atol=1e-4):
                return False
    return True


class PackedWeight:
    """An MKL-packed copy of a float32 (out, in) weight, remade when the weight is not the one packed."""

    def __init__(self) -> None:
        self.packed: Optional[torch.Tensor] = None
        self.packed_from: Optional[torch.Tensor] = None  # the tensor packed: alive, its address stays taken
        self.source: tuple = ()

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        # An edit through `weight.data` moves neither the storage nor the version; model.train(),
        # load_state_dict or .to() drop the copy instead. MKL's documentation advises packing and
        # multiplying with the same thread count, for speed, so a new count repacks.
        source = (weight.data_ptr(), weight._version, weight.shape, weight.dtype, weight.device, torch.get_num_threads())
        if self.packed is None or source != self.source:
            self.packed_from = weight.detach()
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.packed_from, PACKED_FOR_ROWS)
            self.source = source
        return self.packed

    def drop(self) -> None:
        self.packed, self.packed_from, self.source = None, None, ()

    # A packed tensor has no storage to copy or pickle; a copied or pickled module packs afresh.
    def __deepcopy__(self, memo: dict) -> "PackedWeight":
        return PackedWeight()

    def __getstate__(self) -> dict:
        return {"packed": None, "packed_from": None, "source": ()}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
           packed: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight^T + bias, by the packed copy of `weight` when there is one and x has few rows."""
    rows = x.numel() // weight.shape[1]
    # The packed product takes its widths from `weight` and would read a wrong-width x as other
    # rows: F.linear raises the shape error.
    if packed is None or rows > PACKED_MAX_ROWS or x.shape[-1] != weight.shape[1]:
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


class InferenceCopies(nn.Module):
    """A module that holds packed copies of weights for `inference_weights`, and drops them
    whenever its weights may have changed behind the version counter's back."""

    def activate_inference_copies(self) -> None:
        raise NotImplementedError

    def deactivate_inference_copies(self) -> None:
        raise NotImplementedError

    def drop_inference_copies(self) -> None:
        raise NotImplementedError

    def train(self, mode: bool = True):
        if mode:
            self.drop_inference_copies()  # training changes the weights; no need to hold copies
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        self.drop_inference_copies()  # .to(), .cuda(), .half() ...
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs):
        self.drop_inference_copies()
        return super()._load_from_state_dict(*args, **kwargs)


class Linear(InferenceCopies, nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias)
        self._packed = PackedWeight()  # kept between searches
        self._active: Optional[torch.Tensor] = None  # the packed copy, inside `inference_weights`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The forward pass, callable without module dispatch: a decoding step makes ~30 of these,
        and at one row per step their Python overhead shows, so this path checks no more than
        `linear` does."""
        return linear(x, self.weight, self.bias, self._active)

    def activate_inference_copies(self) -> None:
        self._active = self._packed.of(self.weight)

    def deactivate_inference_copies(self) -> None:
        self._active = None

    def drop_inference_copies(self) -> None:
        self.deactivate_inference_copies()
        self._packed.drop()


_packing_switched_off = False


@contextmanager
def without_packed_weights() -> Iterator[None]:
    """Searches started inside multiply by the stored weights (`bench_decode.py --packing-ablation`)."""
    global _packing_switched_off
    before, _packing_switched_off = _packing_switched_off, True
    try:
        yield
    finally:
        _packing_switched_off = before


def _packing_applies(model: nn.Module, parameter: Optional[torch.Tensor]) -> bool:
    return (not _packing_switched_off and not model.training and not torch.is_grad_enabled() and parameter is not None
            and parameter.device.type == "cpu" and parameter.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and mkl_packing_available())


@contextmanager
def inference_weights(model: nn.Module) -> Iterator[None]:
    """Within, the model's `InferenceCopies` modules multiply by packed copies of their weights.

    For decoding on the CPU: it acts only with gradients off, the model in eval mode and float32,
    and no autocast (the copies carry no gradient and bypass autocast), and the weights must not
    change inside, which a search never does. Entered again inside itself (a search within a
    search), it leaves the copies to the outer one.
    """
    if not _packing_applies(model, next(model.parameters(), None)) or getattr(model, "_inference_weights_active", False):
        yield
        return
    holders = [module for module in model.modules() if isinstance(module, InferenceCopies)]
    model._inference_weights_active = True
    try:
        for holder in holders:
            holder.activate_inference_copies()
        yield
    finally:
        for holder in holders:
            holder.deactivate_inference_copies()
        model._inference_weights_active = False

