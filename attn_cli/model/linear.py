"""Decoding with weights stored the other way round.

`nn.Linear` keeps its weight as (out, in) and multiplies x @ weight^T. For the few rows of a
decoding step MKL is often faster with a contiguous (in, out) matrix, and sometimes slower.
`python scripts/bench_decode.py --weight-layout` times one decoding step's matrix products (the
output projection included) both ways, per matrix shape too, cycling through all the weights so
that they come from memory, not cache. On 2 threads the (in, out) layout was, small size
(d_model 256) / base size (512), over the whole step:
  - 1 row:     1.03x / 1.41x    (greedy, batch 1; an earlier run: 0.96x / 1.05x)
  - 2-3 rows:  0.91x / 0.58x
  - 4-8 rows:  1.19-1.43x / 0.66-0.71x    (beam 5, batch 1: 5 rows)
  - 12 rows:   1.31x / 0.78x
  - 16-32 rows: 1.15-1.39x / 1.21-1.25x   (greedy, batch 32)
  - 160 rows:  1.08x / 1.03x   (beam 5, batch 32)
Per matrix, every matrix with a 512- or 1024-wide input (all of the base size's, the small size's
second feed-forward matrix) is faster as stored from 2 to 12 rows, by 1.3-2x at the base size;
the others gain from the copy. Which kernel MKL picks for a shape is its own affair, so the rule
below, `stored_layout_is_faster`, is a measurement, not a law.

So inside `inference_weights(model)`, which the searches enter, every `InferenceCopies` module (each
`Linear`, and the Transformer for its output matrix) multiplies by a contiguous transposed copy of
its weight, except at the row counts where the rule keeps the stored layout. The copies are kept
between searches and remade when a weight changes: in place (its version counter moves), or when
it is replaced, moved or cast, or the module is loaded or put back into training. Outside the
context, and always on GPUs, where nothing here was measured, the modules use their weights as
they are. Parameters and checkpoints are those of `nn.Linear`.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn


def stored_layout_is_faster(rows: int, in_features: int) -> bool:
    """Whether nn.Linear's own (out, in) weight multiplies `rows` rows faster than the (in, out)
    copy: from 2 to 12 rows when the input is at least 512 wide (`--weight-layout`, per matrix)."""
    return 2 <= rows <= 12 and in_features >= 512


class TransposedCopy:
    """A contiguous copy of a 2-D weight's transpose, remade when the weight is not the one copied."""

    def __init__(self) -> None:
        self.copy: Optional[torch.Tensor] = None
        self.source: tuple = ()

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        # An edit through `weight.data` moves neither the storage nor the version; model.train(),
        # load_state_dict or .to() drop the copy instead.
        source = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        if self.copy is None or source != self.source:
            with torch.no_grad():
                self.copy = weight.detach().t().contiguous()
            self.source = source
        return self.copy

    def drop(self) -> None:
        self.copy, self.source = None, ()


class InferenceCopies(nn.Module):
    """A module that holds transposed copies of weights for `inference_weights`, and drops them
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
        self._transposed = TransposedCopy()  # the (in, out) copy, kept between searches
        self._active: Optional[torch.Tensor] = None  # its (out, in) view, inside `inference_weights`
        self._active_bias: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The forward pass, callable without module dispatch: a decoding step makes ~30 of these,
        and at one row per step their Python overhead shows, so this path checks nothing."""
        if self._active is None or stored_layout_is_faster(x.numel() // self.in_features, self.in_features):
            return F.linear(x, self.weight, self.bias)
        # A (out, in) view of the contiguous (in, out) copy: F.linear multiplies by its transpose,
        # which is the contiguous matrix itself.
        return F.linear(x, self._active, self._active_bias)

    def activate_inference_copies(self) -> None:
        self._active, self._active_bias = self._transposed.of(self.weight).t(), self.bias

    def deactivate_inference_copies(self) -> None:
        self._active = self._active_bias = None

    def drop_inference_copies(self) -> None:
        self.deactivate_inference_copies()
        self._transposed.drop()


@contextmanager
def inference_weights(model: nn.Module) -> Iterator[None]:
    """Within, the model's `InferenceCopies` modules multiply by transposed copies of their weights.

    For decoding on the CPU: it acts only with gradients off and the model in eval mode (the copies
    carry no gradient), and the weights must not change inside, which a search never does. Entered
    again inside itself (a search within a search), it leaves the copies to the outer one.
    """
    parameter = next(model.parameters(), None)
    if (model.training or torch.is_grad_enabled() or parameter is None or parameter.device.type != "cpu"
            or getattr(model, "_inference_weights_active", False)):
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


def with_inference_weights(search: Callable) -> Callable:
    """Decorates a search whose first argument is the model: it runs inside `inference_weights`."""

    @functools.wraps(search)
    def wrapped(model: nn.Module, *args, **kwargs):
        with inference_weights(model):
            return search(model, *args, **kwargs)

    return wrapped
