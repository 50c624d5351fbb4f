"""The training loss: label-smoothed cross-entropy over the target vocabulary.

Two ways to the same number. `label_smoothed_loss` takes logits, as validation and the tests use
it. Training uses `projected_label_smoothed_loss`, which takes the decoder's final hidden states
and the output matrix and never builds the (tokens, vocabulary) logits: it runs over chunks of
rows, and for each chunk computes the logits, the loss, and at once the gradient of the loss with
respect to the logits (softmax minus the smoothed target), which it turns straight into the
gradients of the hidden states and of the output matrix. The same matrix products as the plain
way, but the elementwise work happens on a chunk that stays in cache, instead of a log-softmax,
a gather and a sum over all the logits and their gradients; and the logits are never held for
backward. docs/benchmarks.md has the figures (`python3 -m bench.train --parts loss`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from attn_cli.vocab import PAD_ID

# Rows per chunk: a (rows, vocabulary) fp32 block of about 4 MB, the size of a core's L2 cache.
CHUNK_ELEMENTS = 1 << 20
# On a GPU each chunk costs a dozen kernel launches, so chunks are larger there.
GPU_CHUNK_ELEMENTS = 1 << 24


def label_smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> tuple[torch.Tensor, int]:
    """Summed loss over non-padding positions, and how many there were. Computed in fp32."""
    loss = F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=PAD_ID, label_smoothing=smoothing, reduction="sum"
    )
    return loss, int((labels != PAD_ID).sum())


def projected_label_smoothed_loss(
    hidden: torch.Tensor,
    output_weight: torch.Tensor,
    labels: torch.Tensor,
    smoothing: float,
    output_bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`label_smoothed_loss(F.linear(hidden, output_weight, output_bias), labels, smoothing)[0]`
    without the logits.

    hidden (B, T, D) decoder output, output_weight (V, D), output_bias (V,) or None, labels (B, T). Under autocast the
    matrix products run in the autocast dtype, as they would for the logits, and the softmax in fp32.
    It does not count the target tokens: the caller knows them, and on a GPU counting would wait
    for the device.
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    # Inside the Function, needs_input_grad says whether the inputs require gradients, not whether
    # gradients are being recorded; under no_grad the gradients would be computed for nothing.
    wants_gradients = torch.is_grad_enabled() and (
        hidden.requires_grad or output_weight.requires_grad or (output_bias is not None and output_bias.requires_grad)
    )
    chunk_elements = CHUNK_ELEMENTS if device == "cpu" else GPU_CHUNK_ELEMENTS
    return _ProjectedLabelSmoothedLoss.apply(
        hidden.flatten(0, 1),
        output_weight,
        output_bias,
        labels.flatten(),
        smoothing,
        dtype,
        wants_gradients,
        chunk_elements,
    )


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Forward computes the loss and, when gradients are wanted, the gradients themselves; backward
    only scales them by the incoming gradient (a scalar: the loss is a sum)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, smoothing, dtype, wants_gradients, chunk_elements):
        # hidden (N, D), weight (V, D), bias (V,) or None, labels (N,). Casts are explicit, so
        # autocast stays out of it.
        with torch.autocast(hidden.device.type, enabled=False):
            total, grad_hidden, grad_weight, grad_bias = _chunked(
                hidden,
                weight,
                bias,
                labels,
                smoothing,
                dtype,
                wants_gradients,
                max(1, chunk_elements // weight.shape[0]),
            )
        ctx.has_bias = bias is not None
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        grad_bias = grad_bias * grad_total if ctx.has_bias else None
        return grad_hidden * grad_total, grad_weight * grad_total, grad_bias, None, None, None, None, None


def _chunked(hidden, weight, bias, labels, smoothing, dtype, wants_gradients, chunk):
    rows, vocabulary = hidden.shape[0], weight.shape[0]
    matrix = weight.to(dtype)
    offsets = bias.to(dtype) if bias is not None else None
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if wants_gradients else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if wants_gradients else None
    grad_bias = torch.zeros(vocabulary, dtype=torch.float32, device=weight.device) if wants_gradients else None
    for start in range(0, rows, chunk):
        inputs = hidden[start : start + chunk].to(dtype)
        targets = labels[start : start + chunk]
        # (chunk, V), as F.linear computes them: the bias added in the matrix product's dtype
        logits = (inputs @ matrix.t() if offsets is None else torch.addmm(offsets, inputs, matrix.t())).float()
        real = targets != PAD_ID
        # loss = (1 - eps) * (lse - z_y) + eps * (lse - mean z): cross-entropy against the target
        # mixed with the uniform distribution, as F.cross_entropy's label_smoothing defines it.
        target_logits = logits.gather(1, targets[:, None]).squeeze(1)
        mean_logits = logits.mean(dim=1)
        peak = logits.amax(dim=1, keepdim=True)
        probabilities = logits.sub_(peak).exp_()  # in place: the logits are not needed again
        normaliser = probabilities.sum(dim=1)
        log_normaliser = normaliser.log() + peak.squeeze(1)
        losses = log_normaliser - (1 - smoothing) * target_logits - smoothing * mean_logits
        total += torch.where(real, losses, 0.0).sum()
        if not wants_gradients:
            continue
        # d loss / d logits = softmax - (1 - eps) * onehot(y) - eps / V, and 0 on padding rows.
        gradient = probabilities.mul_((real / normaliser)[:, None]).sub_((real * (smoothing / vocabulary))[:, None])
        gradient.scatter_add_(1, targets[:, None], (real * -(1 - smoothing)).to(gradient.dtype)[:, None])
        gradient = gradient.to(dtype)
        grad_hidden[start : start + chunk] = gradient @ matrix
        if dtype == torch.float32:
            grad_weight.addmm_(gradient.t(), inputs)
        else:
            grad_weight += (gradient.t() @ inputs).float()
        if offsets is not None:
            grad_bias += gradient.sum(dim=0, dtype=torch.float32)
    if wants_gradients:
        # Padding's row of the output matrix (the target embedding's, tied) and its bias stay as
        # they began, 0, which is what nn.Embedding(padding_idx) means for the row: padding is never
        # an output (the searches rule it out before the softmax), so they would only learn to
        # shrink the training softmax's padding term. Marian, with no padding output, could not
        # hold them (attn_cli/huggingface/marian.py).
        grad_weight[PAD_ID] = 0
        if grad_bias is not None:
            grad_bias[PAD_ID] = 0
    return total, grad_hidden, grad_weight, grad_bias
