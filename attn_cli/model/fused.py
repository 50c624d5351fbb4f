"""The feed-forward layer's first product and its ReLU in one oneDNN call, for fp32 training on a CPU.

Written plainly, `relu(x @ W^T + b)` makes three passes over the (tokens, ffn_dim) hidden layer,
the largest activation of a training step (16 MB per layer at 2,048 tokens and ffn_dim 2,048):
`addmm` first copies the bias into its output, the product adds onto it, and the ReLU reads it
again and writes a new tensor. oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`, which
PyTorch's compiler also calls) adds the bias and applies the ReLU as the product writes each
block. Its product alone is 3-5% slower than MKL's at these shapes, but the passes it saves made
whole fp32 training steps (`scripts/bench_train.py` sizes, 2 threads, the two versions alternating
in one process) 1.024-1.037x as fast at the base size (medians, three runs) and 1.00-1.01x at the
small size.

The backward is the plain one (ReLU's gradient, then a linear layer's two products and bias sum);
it cannot be differentiated again (double backward raises). The forward agrees with
`F.relu(F.linear(...))` to rounding, except that oneDNN's ReLU turns a NaN pre-activation into 0
where `F.relu` keeps it: a NaN in this layer's first weight or bias would not reach the loss.
Training does not put one there: it skips every update whose loss is not finite, and with
clipping on (the default) every update whose gradients are not (`TrainingStep`).

Where the op is missing or gives wrong values in a one-off check, where `torch.backends.mkldnn`
is switched off, on other devices and dtypes, under autocast (bf16 and fp16 go through
autocast's casts) and under torch.compile, the feed-forward layer keeps the plain path.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _onednn_linear_available() -> bool:
    """Whether the op exists here and gives relu(x W^T + b), checked once per process: it is a
    private op, and its signature could change between PyTorch versions."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((5, 8), (16, 8), (16,)))
    try:
        fused = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "relu", [], "")
    except (AttributeError, RuntimeError, TypeError):
        return False
    return fused.shape == (5, 16) and torch.allclose(fused, torch.relu(x @ weight.t() + bias), atol=1e-5)


def fused_linear_relu_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear_relu` may take the fused path for this input and weight."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and torch.backends.mkldnn.enabled and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling() and _onednn_linear_available())


class _LinearReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (N, in)
        out = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "relu", [], "")  # (N, out)
        ctx.save_for_backward(rows, weight, out)
        ctx.input_shape = x.shape
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        rows, weight, out = ctx.saved_tensors
        # ReLU's gradient: through where the output is positive (the gradient of F.relu).
        grad_hidden = torch.ops.aten.threshold_backward(grad_out.reshape(out.shape), out, 0)  # (N, out)
        grad_x = (grad_hidden @ weight).view(ctx.input_shape) if ctx.needs_input_grad[0] else None
        grad_weight = grad_hidden.t() @ rows if ctx.needs_input_grad[1] else None
        grad_bias = grad_hidden.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(x @ weight^T + bias) for (..., in) x, in one oneDNN call; check `fused_linear_relu_applies` first."""
    return _LinearReLU.apply(x, weight, bias)
