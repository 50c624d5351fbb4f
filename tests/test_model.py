"""Properties of the Transformer that a wrong implementation would break."""

import pytest
import torch
from support.models import random_source, small_model

from attn_cli.data.batching import Example
from attn_cli.data.collate import collate
from attn_cli.model.attention import MultiHeadAttention, causal_mask, key_padding_mask
from attn_cli.vocab import BOS_ID, PAD_ID

VARIANTS = [
    dict(),
    dict(pre_norm=False),
    dict(activation="silu"),
    dict(sinusoid_layout="halves", pre_norm=False),
    dict(output_bias=True, pre_norm=False, activation="silu"),
    dict(positions="learned"),
    dict(share_embeddings=False, tgt_vocab_size=40),
    dict(positions="relative"),
    dict(positions="rotary"),
]


def test_explicit_attention_path_equals_fused_kernel_and_returns_weights():
    attention = MultiHeadAttention(32, 4, cross=True).eval()
    query, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    mask = key_padding_mask(torch.tensor([[5] * 7, [5] * 4 + [0] * 3, [5] * 2 + [0] * 5]), PAD_ID)
    fused, no_weights = attention(query, memory, mask=mask)
    explicit, weights = attention(query, memory, mask=mask, need_weights=True)
    assert no_weights is None
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    assert weights.shape == (3, 4, 5, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 5))
    assert weights[1, :, :, 4:].abs().max() == 0 and weights[2, :, :, 2:].abs().max() == 0


def test_causal_self_attention_weights_are_zero_above_the_diagonal():
    model = small_model()
    src, tgt = random_source(2, 6), torch.randint(4, 50, (2, 5))
    attention = {}
    model.decode(tgt, model.encode(src), attention=attention)
    for weights in attention["decoder_self"]:
        assert torch.all(weights.triu(diagonal=1) == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
    assert len(attention["cross"]) == 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_position_does_not_depend_on_later_target_tokens(variant):
    model = small_model(**variant)
    vocab = model.tgt_embedding.num_embeddings
    src = random_source(2, 6)
    tgt = torch.randint(4, vocab, (2, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, vocab, (2, 3))
    encoded = model.encode(src)
    before, after = model.decode(tgt, encoded), model.decode(changed, encoded)
    torch.testing.assert_close(before[:, :5], after[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, 5:], after[:, 5:])  # the later positions do see the change


@pytest.mark.parametrize("variant", VARIANTS)
def test_encoder_position_depends_on_every_source_token(variant):
    model = small_model(**variant)
    src = random_source(1, 8)
    base = model.encode(src).memory
    for position in range(7):  # the last token is EOS
        changed = src.clone()
        changed[0, position] = 4 + (src[0, position] - 4 + 1) % 46
        difference = (model.encode(changed).memory - base).abs().amax(dim=-1)[0]
        assert torch.all(difference > 1e-6), f"changing source token {position} left some outputs unchanged"


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative", "rotary"])
def test_permuting_the_source_changes_the_output(positions):
    model = small_model(positions=positions)
    src = torch.tensor([[10, 11, 12, 13, 14, 3]])
    permuted = torch.tensor([[14, 13, 12, 11, 10, 3]])
    tgt = torch.tensor([[BOS_ID, 20, 21]])
    # Without positions the encoder would be permutation-equivariant and the decoder's attention
    # over the memory permutation-invariant, giving identical logits.
    assert not torch.allclose(model(src, tgt), model(permuted, tgt), atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_changes_no_encoder_output_or_logits(variant):
    model = small_model(**variant)
    vocab = model.tgt_embedding.num_embeddings
    examples = [
        Example(i, torch.randint(4, 50, (n,)).tolist(), torch.randint(4, vocab, (m,)).tolist())
        for i, (n, m) in enumerate([(9, 7), (3, 2), (6, 9)])
    ]
    batch = collate(examples)
    encoded = model.encode(batch.src)
    logits = model.decode(batch.tgt_in, encoded)
    for row, example in enumerate(examples):
        alone = collate([example])
        alone_encoded = model.encode(alone.src)
        n, m = alone.src.shape[1], alone.tgt_in.shape[1]
        torch.testing.assert_close(encoded.memory[row, :n], alone_encoded.memory[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[row, :m], model.decode(alone.tgt_in, alone_encoded)[0], atol=1e-5, rtol=1e-5)


def test_causal_mask_shape_and_polarity():
    mask = causal_mask(3, torch.device("cpu"))
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_checkpoints_with_separate_q_k_v_matrices_load_into_the_fused_projections():
    from attn_cli.checkpoint import _fuse_attention_projections

    model = small_model()
    separate = {}
    for name, tensor in model.state_dict().items():
        for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("kv_proj", ("k_proj", "v_proj"))):
            if f".{fused}." in name:
                for part, chunk in zip(parts, tensor.chunk(len(parts))):
                    separate[name.replace(fused, part)] = chunk
                break
        else:
            separate[name] = tensor
    assert any(".q_proj." in name for name in separate if "self_attention" in name)
    upgraded = _fuse_attention_projections(separate)
    assert upgraded.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(upgraded[name], tensor), name


def _gradients_and_layer_calls(checkpointing: bool):
    """Gradients of one training forward/backward with dropout on, and how often layers ran."""
    torch.manual_seed(0)
    model = small_model(dropout=0.3, attention_dropout=0.2).train()
    model.gradient_checkpointing = checkpointing
    calls = []

    def counted(forward):
        def run(*args, **kwargs):
            calls.append(1)
            return forward(*args, **kwargs)

        return run

    for layer in [*model.encoder_layers, *model.decoder_layers]:
        layer.forward = counted(layer.forward)  # forward hooks do not fire when checkpointing recomputes
    src = random_source(3, 7, lengths=[7, 5, 3])
    tgt = random_source(3, 6, lengths=[6, 6, 2])
    torch.manual_seed(1)  # the same dropout masks in both runs
    model(src, tgt).square().mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}, len(calls)


def test_gradient_checkpointing_recomputes_layers_and_gives_the_same_gradients():
    plain, plain_calls = _gradients_and_layer_calls(False)
    recomputed, recomputed_calls = _gradients_and_layer_calls(True)
    assert plain_calls == 4 and recomputed_calls == 8, "each layer must run again in backward"
    for name, gradient in plain.items():
        torch.testing.assert_close(recomputed[name], gradient, rtol=1e-5, atol=1e-6, msg=name)


def test_gradient_checkpointing_refuses_the_kv_cache_in_training_mode():
    model = small_model().train()
    model.gradient_checkpointing = True
    src = random_source(2, 5)
    with pytest.raises(RuntimeError, match="model.eval"):
        model.decode(torch.full((2, 1), BOS_ID), model.encode(src), cache=model.new_cache())
    model.eval()  # inference with the cache is fine once out of training mode
    assert model.decode(torch.full((2, 1), BOS_ID), model.encode(src), cache=model.new_cache()).shape[:2] == (2, 1)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_dropout_acts_in_training_only(pre_norm):
    """In training a residual sublayer's output is dropped at rate p and the rest scaled by 1/(1-p);
    in evaluation the residual adds the sublayer's output unchanged."""
    from attn_cli.model.transformer import Residual

    residual = Residual(16, dropout=0.25, pre_norm=pre_norm)
    residual.norm.weight.data.fill_(1.0)
    x, out = torch.zeros(200, 50, 16), torch.ones(200, 50, 16)
    unnormalised = Residual(16, dropout=0.25, pre_norm=True)  # pre-LN adds without normalising
    dropped = unnormalised.train().add(x, out)
    assert abs((dropped == 0).float().mean().item() - 0.25) < 0.01
    torch.testing.assert_close(dropped[dropped != 0], torch.full_like(dropped[dropped != 0], 1 / 0.75))
    assert not torch.equal(unnormalised.add(x, out), dropped)  # a fresh mask each call
    torch.testing.assert_close(residual.eval().add(x, out), x + out if pre_norm else residual.norm(x + out))


def test_embeddings_are_dropped_in_training_and_not_in_evaluation():
    from attn_cli.model.transformer import Residual

    model = small_model(dropout=0.5)
    for module in model.modules():
        if isinstance(module, Residual):
            module.dropout = 0.0  # only the embeddings' dropout is left
    src = random_source(2, 6)
    model.eval()
    assert torch.equal(model.encode(src).memory, model.encode(src).memory)
    model.train()
    assert not torch.equal(model.encode(src).memory, model.encode(src).memory)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_the_feed_forward_applies_model_activation_with_the_same_parameter_names(activation):
    """Linear, the activation model.activation names, Linear; the names of the weights do not depend
    on it, so that checkpoints from before the key load unchanged."""
    from attn_cli.model.transformer import FeedForward

    torch.manual_seed(0)
    feed_forward = FeedForward(8, 16, activation)
    x = torch.randn(3, 8) * 3
    function = {"relu": torch.nn.functional.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}
    expected = feed_forward[2](function[activation](feed_forward[0](x)))
    assert torch.allclose(feed_forward(x), expected)
    assert feed_forward.state_dict().keys() == FeedForward(8, 16).state_dict().keys()


def test_marian_s_sinusoids_are_every_sine_then_every_cosine():
    """model.sinusoid_layout: halves, against Marian's formula written out: feature j of position p
    is p / 10000^(2 (j // 2) / d), its sine in the first half (even j), its cosine in the second."""
    import math

    from attn_cli.model.positions import SinusoidalPositions

    d, length = 16, 40
    angle = [[p / 10000 ** (2 * (j // 2) / d) for j in range(d)] for p in range(length)]
    expected = torch.tensor(
        [[math.sin(row[j]) for j in range(0, d, 2)] + [math.cos(row[j]) for j in range(1, d, 2)] for row in angle]
    )
    assert torch.allclose(SinusoidalPositions(d, length, "halves")(0, length), expected, atol=1e-5)
    assert torch.allclose(SinusoidalPositions(d, 8, "halves")(30, 10), expected[30:], atol=1e-5), "grown on demand"
    assert not torch.allclose(SinusoidalPositions(d, length)(0, length), expected, atol=1e-2), "interleaved differs"


def test_the_output_bias_is_added_to_every_logit_and_learns():
    """model.output_bias: the logits are the plain model's plus one trained offset per target token;
    a model without one has no such parameter, so older checkpoints load as they are."""
    from attn_cli.training.step import TrainingObjective

    torch.manual_seed(0)
    plain = small_model()
    biased = small_model(output_bias=True)
    assert "output_bias" not in plain.state_dict()
    biased.load_state_dict({**plain.state_dict(), "output_bias": torch.randn(50)})
    src, tgt = random_source(2, 6), torch.randint(4, 50, (2, 5))
    expected = plain.decode(tgt, plain.encode(src)) + biased.output_bias
    torch.testing.assert_close(biased.decode(tgt, biased.encode(src)), expected)
    biased.train()
    TrainingObjective(biased, 0.1)(src, tgt, torch.randint(4, 50, (2, 5))).backward()
    assert biased.output_bias.grad is not None and biased.output_bias.grad.abs().sum() > 0
