"""Decoding without nn.Module's slow attribute lookup.

nn.Module keeps its parameters and submodules in dicts of their own (`_parameters`, `_modules`)
and finds `self.weight` or `self.norm` through `__getattr__`, which Python calls only after its
ordinary lookup has searched the instance and every class in the method resolution order and
failed. A decoding step of the base model makes about 200 such lookups (each layer reaches its
attention, residual, LayerNorm and linear modules and their weights), and at one sentence a
step is short enough for them to show: base greedy decoding at batch 1 ran 4.4-4.6% faster with
them found at once (two in-process A/B runs of 11 rounds).

`plain_attribute_lookups(model)` copies every module's parameters and submodules into its
instance dict for the duration of a search, where the ordinary lookup finds them first; it
removes the copies afterwards. Buffers are left alone: a module may replace one inside a search
(`SinusoidalPositions` grows its table), and a copy would hide the new tensor. Assigning a
parameter or a submodule inside is safe too (`nn.Module.__setattr__` drops the instance-dict
entry of that name before registering the new value); the searches assign neither.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def plain_attribute_lookups(model: nn.Module) -> Iterator[None]:
    """Within, each module of `model` finds its parameters and submodules as plain attributes.
    Entered again inside itself (a search within a search), it leaves them to the outer one."""
    if model.__dict__.get("_plain_lookups_active", False):
        yield
        return
    copied = []  # (module, name, value) for each copy made
    model._plain_lookups_active = True
    try:
        for module in model.modules():
            instance = module.__dict__
            for name, value in (*module._parameters.items(), *module._modules.items()):
                if value is not None and name not in instance:
                    instance[name] = value
                    copied.append((module, name, value))
        yield
    finally:
        for module, name, value in copied:
            if module.__dict__.get(name) is value:  # not already replaced by an assignment inside
                del module.__dict__[name]
        del model._plain_lookups_active
