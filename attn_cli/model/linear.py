"""A linear layer that decodes with its weight stored the other way round.

`nn.Linear` keeps its weight as (out, in) and multiplies x @ weight^T. For the few rows of a
decoding step, MKL is mostly faster with a contiguous (in, out) matrix. Measured on 2 threads,
cycling through one decoding step's worth of weights so that they come from memory, not cache:
  - small size (d_model 256): faster at every row count from 1 to 160, by 24% at 5 rows and 10%
    at 32;
  - base size (512): 10% faster at 1 row and 8% at 32, but 13-18% slower at 2 to 8 rows (beam 5
    at batch 1), where MKL's kernel for the (out, in) layout happens to be better.
So inside `inference_weights(model)`, which the searches enter, each `Linear` multiplies by a
contiguous (in, out) copy of its weight, checked against the weight once on entry and made again
only when the weight has changed. Everywhere else, training included, it is an `nn.Linear`;
parameters and checkpoints are those of `nn.Linear`.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias)
        self._transposed: Optional[torch.Tensor] = None  # the (in, out) copy, kept between searches
        self._transposed_of: tuple = ()  # the weight's storage, version and dtype it was copied from
        self._active: Optional[torch.Tensor] = None  # a view of the copy, while inside `inference_weights`
        self._active_bias: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The forward pass, callable without module dispatch: a decoding step makes ~30 of these,
        and at one row per step their Python overhead shows, so this path checks nothing."""
        if self._active is None:
            return F.linear(x, self.weight, self.bias)
        # A (out, in) view of the contiguous (in, out) copy: F.linear multiplies by its transpose,
        # which is the contiguous matrix itself.
        return F.linear(x, self._active, self._active_bias)

    def _activate(self) -> None:
        weight = self.weight
        source = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        if self._transposed_of != source:
            with torch.no_grad():
                self._transposed = weight.t().contiguous()
            self._transposed_of = source
        self._active, self._active_bias = self._transposed.t(), self.bias

    def _deactivate(self) -> None:
        self._active = self._active_bias = None


@contextmanager
def inference_weights(model: nn.Module) -> Iterator[None]:
    """Within, the model's `Linear`s multiply by (in, out) copies of their weights, taken on entry.

    For decoding: it acts only with gradients off and the model in eval mode (the copies carry no
    gradient), and the weights must not change inside, which a search never does.
    """
    if model.training or torch.is_grad_enabled():
        yield
        return
    linears = [module for module in model.modules() if isinstance(module, Linear)]
    for linear in linears:
        linear._activate()
    try:
        yield
    finally:
        for linear in linears:
            linear._deactivate()


def with_inference_weights(search: Callable) -> Callable:
    """Decorates a search whose first argument is the model: it runs inside `inference_weights`."""

    @functools.wraps(search)
    def wrapped(model: nn.Module, *args, **kwargs):
        with inference_weights(model):
            return search(model, *args, **kwargs)

    return wrapped
