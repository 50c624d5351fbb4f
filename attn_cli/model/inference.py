"""The context every search runs in: packed weights for the matrix products
(`linear.inference_weights`) and plain attribute lookups (`lookups.plain_attribute_lookups`).
Both leave the model as it was when the search ends."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Iterator

from torch import nn

from attn_cli.model.linear import inference_weights
from attn_cli.model.lookups import plain_attribute_lookups


@contextmanager
def inference_context(model: nn.Module) -> Iterator[None]:
    with inference_weights(model), plain_attribute_lookups(model):
        yield


def with_inference_context(search: Callable) -> Callable:
    """Decorates a search whose first argument is the model: it runs inside `inference_context`."""

    @functools.wraps(search)
    def wrapped(model: nn.Module, *args, **kwargs):
        with inference_context(model):
            return search(model, *args, **kwargs)

    return wrapped
