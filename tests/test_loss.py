"""The training loss that never builds the logits equals the plain one, value and gradients."""

import pytest
import torch

from attn_cli.training import loss as loss_module
from attn_cli.training.loss import label_smoothed_loss, projected_label_smoothed_loss
from attn_cli.vocab import PAD_ID


def inputs(seed, rows=3, length=7, width=16, vocabulary=50):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, length, width, generator=generator, requires_grad=True)
    weight = torch.randn(vocabulary, width, generator=generator).mul_(0.5).requires_grad_()
    labels = torch.randint(1, vocabulary, (rows, length), generator=generator)
    labels[0, 4:] = PAD_ID  # padded rows of different lengths
    labels[1, 6:] = PAD_ID
    return hidden, weight, labels


def without_padding_gradient(weight):
    """weight, its padding row held: training leaves padding's output row (and bias) as they are."""
    return torch.cat([weight[: PAD_ID + 1].detach(), weight[PAD_ID + 1 :]])


def plain(hidden, weight, labels, smoothing):
    return label_smoothed_loss(hidden @ without_padding_gradient(weight).t(), labels, smoothing)[0]


def value_and_gradients(function, hidden, weight, labels, smoothing):
    """The loss and the gradients of 0.37 x loss (a scale other than 1 checks that backward uses it)."""
    hidden.grad = weight.grad = None
    total = function(hidden, weight, labels, smoothing)
    (total * 0.37).backward()
    return [total.detach()] + [None if x.grad is None else x.grad.clone() for x in (hidden, weight)]


def assert_all_close(got, expected, **tolerance):
    for name, a, b in zip(("loss", "hidden gradient", "weight gradient"), got, expected):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, msg=name, **tolerance)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
def test_the_projected_loss_equals_the_loss_of_the_logits(monkeypatch, smoothing, chunk_rows):
    hidden, weight, labels = inputs(seed=int(smoothing * 10) + chunk_rows)
    # Chunks that split the rows unevenly, or hold them all.
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_rows * weight.shape[0])
    expected = value_and_gradients(plain, hidden, weight, labels, smoothing)
    got = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, smoothing)
    assert_all_close(got, expected, rtol=1e-5, atol=1e-5)


def test_padding_gets_no_loss_and_no_gradient_and_an_all_padding_batch_gives_zero():
    hidden, weight, labels = inputs(seed=3)
    total, hidden_grad, _ = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, 0.1)
    assert (hidden_grad[labels == PAD_ID] == 0).all() and (hidden_grad[labels != PAD_ID] != 0).any()
    moved = hidden.detach().clone()
    moved[labels == PAD_ID] += 5.0
    assert torch.equal(projected_label_smoothed_loss(moved, weight.detach(), labels, 0.1), total)
    empty = value_and_gradients(projected_label_smoothed_loss, hidden, weight, torch.zeros_like(labels), 0.1)
    assert empty[0].item() == 0 and not empty[1].any() and not empty[2].any()


@pytest.mark.parametrize("trainable", ["hidden", "weight"])
def test_only_one_input_needs_gradients(trainable):
    hidden, weight, labels = inputs(seed=6)
    hidden.requires_grad_(trainable == "hidden")
    weight.requires_grad_(trainable == "weight")
    expected = value_and_gradients(plain, hidden, weight, labels, 0.1)
    got = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, 0.1)
    assert_all_close(got, expected, rtol=1e-5, atol=1e-5)


def test_non_contiguous_hidden_states():
    hidden, weight, labels = inputs(seed=7)
    transposed = hidden.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    assert not transposed.is_contiguous()
    expected = value_and_gradients(plain, transposed, weight, labels, 0.1)
    got = value_and_gradients(projected_label_smoothed_loss, transposed, weight, labels, 0.1)
    assert_all_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_it_matches_the_logits_computed_in_that_precision(dtype):
    hidden, weight, labels = inputs(seed=4, rows=4, length=16, width=64, vocabulary=300)
    full_precision = value_and_gradients(plain, hidden, weight, labels, 0.1)
    with torch.autocast("cpu", dtype=dtype):
        expected = value_and_gradients(plain, hidden, weight, labels, 0.1)
        got = value_and_gradients(projected_label_smoothed_loss, hidden, weight, labels, 0.1)
    # The loss must come from products in the autocast dtype: much nearer the plain loss under
    # autocast than the fp32 one, whose rounding differs.
    assert (got[0] - expected[0]).abs() * 8 < (got[0] - full_precision[0]).abs()
    assert_all_close(got, expected, rtol=1e-2, atol=2e-3)


def test_without_gradient_recording_it_computes_only_the_loss(monkeypatch):
    hidden, weight, labels = inputs(seed=5)  # both require gradients
    calls = []
    real_chunked = loss_module._chunked
    monkeypatch.setattr(loss_module, "_chunked", lambda *args: calls.append(args[6]) or real_chunked(*args))
    with torch.no_grad():
        total = projected_label_smoothed_loss(hidden, weight, labels, 0.1)
        expected = plain(hidden, weight, labels, 0.1)
    with torch.inference_mode():
        projected_label_smoothed_loss(hidden, weight, labels, 0.1)
    assert calls == [False, False], "gradients were computed with gradient recording off"
    torch.testing.assert_close(total, expected)
    assert not total.requires_grad


@pytest.mark.parametrize("chunk_rows", [1, 1000])
def test_the_projected_loss_with_an_output_bias_equals_the_loss_of_the_biased_logits(monkeypatch, chunk_rows):
    hidden, weight, labels = inputs(seed=8)
    bias = torch.randn(weight.shape[0], generator=torch.Generator().manual_seed(9)).requires_grad_()
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_rows * weight.shape[0])

    def measured(function):
        hidden.grad = weight.grad = bias.grad = None
        (function() * 0.37).backward()
        return [function().detach(), hidden.grad.clone(), weight.grad.clone(), bias.grad.clone()]

    expected = measured(
        lambda: label_smoothed_loss(
            torch.nn.functional.linear(hidden, without_padding_gradient(weight), without_padding_gradient(bias)),
            labels,
            0.1,
        )[0]
    )
    got = measured(lambda: projected_label_smoothed_loss(hidden, weight, labels, 0.1, bias))
    for name, a, b in zip(("loss", "hidden gradient", "weight gradient", "bias gradient"), got, expected):
        torch.testing.assert_close(a, b, msg=name, rtol=1e-5, atol=1e-5)
    assert got[3].abs().sum() > 0 and got[3][PAD_ID] == 0 and not got[2][PAD_ID].any()
