"""Relative positions: T5's bucketed bias and rotary queries and keys."""

import pytest
import torch
from support.models import reversal_batch, small_model

from attn_cli.model.attention import MultiHeadAttention, causal_mask
from attn_cli.model.positions import RelativePositionBias, RotaryPositions, relative_buckets


def test_buckets_match_a_table_computed_by_hand():
    # 32 buckets up to distance 128. Bidirectional: 16 per direction, distances 0-7 exact, then
    # 8 + floor(log(d / 8) / log(16) * 8): 16 -> 10, 32 -> 12, 64 -> 14, 127 -> 15, beyond -> 15.
    distances = torch.tensor([0, 1, 7, 8, 15, 16, 31, 32, 64, 127, 128, 1000])
    before = [0, 1, 7, 8, 9, 10, 11, 12, 14, 15, 15, 15]
    assert relative_buckets(-distances, True, 32, 128).tolist() == before  # keys before the query
    assert relative_buckets(distances, True, 32, 128).tolist() == [0] + [16 + b for b in before[1:]]
    # Causal: 32 buckets for the past, 0-15 exact, then 16 + floor(log(d / 16) / log(8) * 16):
    # 31 -> 21, 32 -> 21, 64 -> 26, 127 -> 31; later keys (masked anyway) all fall in bucket 0.
    past = torch.tensor([0, 1, 15, 16, 31, 32, 64, 127, 500])
    assert relative_buckets(-past, False, 32, 128).tolist() == [0, 1, 15, 16, 21, 21, 26, 31, 31]
    assert relative_buckets(torch.tensor([1, 5, 200]), False, 32, 128).tolist() == [0, 0, 0]


def test_the_bias_depends_on_the_distance_alone_and_a_cached_step_gets_its_own_row():
    bias = RelativePositionBias(num_heads=3, bidirectional=False, d_model=16)
    whole = bias(0, 9, 9)  # (1, heads, 9, 9)
    assert whole.shape == (1, 3, 9, 9)
    torch.testing.assert_close(whole[0, :, 5, 2], whole[0, :, 7, 4])  # distance 3 both
    torch.testing.assert_close(bias(6, 1, 7)[0, :, 0], whole[0, :, 6, :7])  # the step at position 6


def test_rotated_query_key_products_depend_on_the_distance_alone():
    rotary = RotaryPositions(head_dim=8)
    q, k = torch.randn(1, 1, 8), torch.randn(1, 1, 8)

    def product(query_position, key_position):
        return (rotary.rotate(q, query_position) * rotary.rotate(k, key_position)).sum()

    torch.testing.assert_close(product(5, 2), product(105, 102), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(product(5, 2), product(5, 3))
    torch.testing.assert_close(rotary.rotate(q, 0), q)  # position 0 is no rotation
    torch.testing.assert_close(rotary.rotate(q, 7).norm(), q.norm())  # a rotation keeps the length


@pytest.mark.parametrize("scheme", ["bias", "rotary"])
def test_the_fused_kernel_and_the_explicit_formula_agree_with_relative_positions(scheme):
    attention = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    mask = causal_mask(6, torch.device("cpu"))
    extra = (
        dict(bias=RelativePositionBias(4, False, 32)(0, 6, 6))
        if scheme == "bias"
        else dict(rotary=RotaryPositions(8), start=3)
    )
    fused, _ = attention(x, mask=mask, **extra)
    explicit, weights = attention(x, mask=mask, need_weights=True, **extra)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    assert torch.all(weights[0, 0].triu(diagonal=1) == 0), "the bias leaves the causal mask whole"


@pytest.mark.slow  # trains a model for seconds
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative", "rotary"])
def test_a_tiny_model_learns_to_reverse_its_input(positions, one_thread):
    """Reversing needs positions: without them the encoder could not tell the tokens' order."""
    torch.manual_seed(0)
    model = small_model(
        positions=positions, src_vocab_size=12, tgt_vocab_size=12, encoder_layers=1, decoder_layers=1
    ).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(600):
        batch = reversal_batch(generator)
        loss = torch.nn.functional.cross_entropy(model(batch.src, batch.tgt_in).flatten(0, 1), batch.tgt_out.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    batch = reversal_batch(torch.Generator().manual_seed(99), batch=200)
    with torch.no_grad():
        accuracy = (model(batch.src, batch.tgt_in).argmax(-1) == batch.tgt_out).float().mean().item()
    assert accuracy > 0.95, f"{positions}: {accuracy:.2f} of the reversed tokens right"
