"""A linear layer that decodes with its weight stored the other way round.

`nn.Linear` keeps its weight as (out, in) and multiplies x @ weight^T. On the CPU that transposed
operand is markedly slower for the few rows of a decoding step than a contiguous (in, out) matrix:
at 32 rows, a 2048 -> 512 product took 585 us against 332 us, a 512 -> 2048 one 497 against 386
(2 threads, `torch.addmm`; the two are even from about 160 rows, a training batch). So at inference,
without gradients, `Linear` multiplies by a contiguous (in, out) copy, made once and made again
whenever the weight changes. Training and anything that needs gradients uses the weight itself;
parameters and checkpoints are those of `nn.Linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The forward pass, callable without module dispatch (a decoding step makes ~30 of these)."""
        if self.training or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (N, in)
        out = torch.addmm(self.bias, rows, self._inference_weight()) if self.bias is not None \
            else rows @ self._inference_weight()
        return out.view(*x.shape[:-1], out.shape[-1])

    def _inference_weight(self) -> torch.Tensor:
        """The weight as a contiguous (in, out) matrix; rebuilt when the parameter is updated in
        place (its version moves), replaced, moved or cast."""
        weight = self.weight
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        if getattr(self, "_inference_key", None) != key:
            with torch.no_grad():
                self._inference_copy = weight.t().contiguous()
            self._inference_key = key
        return self._inference_copy
