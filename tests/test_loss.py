"""The training loss that never builds the logits equals the plain one, value and gradients."""

import pytest
import torch

from attn_cli import loss as loss_module
from attn_cli.loss import label_smoothed_loss, projected_label_smoothed_loss
from attn_cli.tokenizer import PAD_ID


def inputs(seed, rows=3, length=7, width=16, vocabulary=50):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, length, width, generator=generator, requires_grad=True)
    weight = torch.randn(vocabulary, width, generator=generator).mul_(0.5).requires_grad_()
    labels = torch.randint(1, vocabulary, (rows, length), generator=generator)
    labels[0, 4:] = PAD_ID  # padded rows of different lengths
    labels[1, 6:] = PAD_ID
    return hidden, weight, labels


def value_and_gradients(function, hidden, weight, labels, smoothing):
    hidden.grad = weight.grad = None
    total, tokens = function(hidden, weight, labels, smoothing)
    (total * 0.37).backward()  # a scale other than 1 checks that backward multiplies by it
    return total.detach(), tokens, hidden.grad.clone(), weight.grad.clone()


def plain(hidden, weight, labels, smoothing):
    return label_smoothed_loss(hidden @ weight.t(), labels, smoothing)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
def test_the_projected_loss_equals_the_loss_of_the_logits(monkeypatch, smoothing, chunk_rows):
    hidden, weight, labels = inputs(seed=int(smoothing * 10) + chunk_rows)
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_rows * weight.shape[0])  # chunks that split rows unevenly
    expected = value_and_gradients(plain, hidden, weight, labels, smoothing)
    got = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, smoothing)
    assert got[1] == expected[1] == int((labels != PAD_ID).sum())
    for name, a, b in zip(("loss", "hidden grad", "weight grad"), got[::2] + got[3:], expected[::2] + expected[3:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_padding_positions_get_no_loss_and_no_gradient():
    hidden, weight, labels = inputs(seed=3)
    total, _, hidden_grad, _ = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, 0.1)
    assert (hidden_grad[labels == PAD_ID] == 0).all() and (hidden_grad[labels != PAD_ID] != 0).any()
    moved = hidden.detach().clone()
    moved[labels == PAD_ID] += 5.0
    assert torch.equal(projected_label_smoothed_loss(moved, weight.detach(), labels, 0.1)[0], total)


def test_under_bf16_autocast_it_matches_the_logits_computed_in_bf16():
    hidden, weight, labels = inputs(seed=4, width=32, vocabulary=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = value_and_gradients(plain, hidden, weight, labels, 0.1)
        got = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, 0.1)
    assert got[2].dtype == hidden.dtype and got[3].dtype == weight.dtype
    for a, b in zip(got[::2] + got[3:], expected[::2] + expected[3:]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_without_gradients_it_only_computes_the_loss():
    hidden, weight, labels = inputs(seed=5)
    with torch.no_grad():
        total, tokens = projected_label_smoothed_loss(hidden, weight, labels, 0.1)
        expected, _ = plain(hidden, weight, labels, 0.1)
    torch.testing.assert_close(total, expected)
    assert not total.requires_grad
