"""Properties of the Transformer that a wrong implementation would break."""

import copy as copy_module
import io
import sys
import threading
from unittest.mock import patch

import pytest
import torch

from attn_cli.data import Example, collate
from attn_cli.beam import beam_search
from attn_cli.decode import greedy_decode, greedy_search
from attn_cli.model import Transformer, inference_weights
from attn_cli.model.attention import MultiHeadAttention, causal_mask, key_padding_mask
from attn_cli.model.lookups import plain_attribute_lookups
from attn_cli.model.fused import fused_linear_relu_applies, linear_relu
from attn_cli.model.transformer import FeedForward
from attn_cli.model.linear import PACKED_MAX_ROWS, Linear, PackedWeight, without_packed_weights
from attn_cli.tokenizer import BOS_ID, PAD_ID

from conftest import random_source, small_model

VARIANTS = [dict(), dict(pre_norm=False), dict(positions="learned"), dict(share_embeddings=False, tgt_vocab_size=40)]


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


def test_permuting_the_source_changes_the_output():
    model = small_model()
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
    examples = [Example(i, torch.randint(4, 50, (n,)).tolist(), torch.randint(4, vocab, (m,)).tolist())
                for i, (n, m) in enumerate([(9, 7), (3, 2), (6, 9)])]
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


def test_the_output_matrix_follows_weight_updates_in_evaluation():
    model = small_model()
    src, tgt = random_source(2, 5), torch.randint(4, 50, (2, 4))
    before = model(src, tgt)
    with torch.no_grad():
        model.tgt_embedding.weight.mul_(1.5)  # an in-place update, as an optimizer makes
    after = model(src, tgt)
    model.train()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, model(src, tgt), atol=1e-5, rtol=1e-5)  # training uses the live view


def _copy_holders(model):
    return [module for module in model.modules() if isinstance(module, (Linear, Transformer))]


def _held_copies(model):
    return [holder._packed.packed if isinstance(holder, Linear) else holder._packed_output.packed
            for holder in _copy_holders(model)]


def test_inference_weights_give_the_plain_logits_and_follow_weight_updates():
    model = small_model().eval()
    src, tgt = random_source(3, 5), torch.randint(4, 50, (3, 4))
    linears = [module for module in model.modules() if isinstance(module, Linear)]
    assert len(linears) == 5 * 2 + 6 * 2  # every projection of the two layers of each stack
    with torch.no_grad():
        plain = model(src, tgt)
        with inference_weights(model):
            assert all(linear._active is not None for linear in linears) and model._active_output is not None
            torch.testing.assert_close(model(src, tgt), plain, atol=1e-5, rtol=1e-5)
            with inference_weights(model):  # a search within a search leaves the copies to the outer one
                pass
            assert all(linear._active is not None for linear in linears)
        assert all(linear._active is None for linear in linears), "outside, the layers use their weights"
        for holder in _copy_holders(model):
            next(holder.parameters()).mul_(1.5)  # in place, as an optimizer or load_state_dict updates
        updated = model(src, tgt)
        with inference_weights(model):
            torch.testing.assert_close(model(src, tgt), updated, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain, updated)
    with inference_weights(model):  # gradients on: the copies would carry none, so it does nothing
        assert all(linear._active is None for linear in linears)
        model(src, tgt).sum().backward()
    assert all(linear.weight.grad is not None for linear in linears)


@pytest.mark.parametrize("change", ["load_state_dict", "cast", "train"])
def test_the_weight_copies_are_dropped_when_the_weights_may_change_unseen(change):
    model, other = small_model(), small_model()  # two different random models
    src = random_source(2, 6)
    with torch.no_grad(), inference_weights(model):
        pass
    assert all(copy is not None for copy in _held_copies(model))
    if change == "load_state_dict":
        model.load_state_dict(other.state_dict())
    elif change == "cast":
        model.double().float()
    else:
        model.train()
        with torch.no_grad():  # an edit the version counter misses, made while training
            for holder in _copy_holders(model):
                next(holder.parameters()).data.mul_(0.5)
        model.eval()
    assert all(copy is None for copy in _held_copies(model))
    with torch.no_grad():
        plain = model(src, torch.randint(4, 50, (2, 3)))
    # The searches run inside inference_weights; without it they must decode the same tokens.
    with_copies = greedy_decode(model, src, exact_steps=6)
    with without_packed_weights():
        without = greedy_decode(model, src, exact_steps=6)
    assert with_copies == without and plain.isfinite().all()


def _registered_names_in_instance_dicts(model):
    """(module, name) of every parameter or submodule that is also a plain attribute of its module."""
    return [(module, name) for module in model.modules()
            for name in (*module._parameters, *module._modules) if name in module.__dict__]


def test_plain_attribute_lookups_last_for_the_outer_search_and_leave_nothing_behind():
    model = small_model().eval()
    layer = model.decoder_layers[0]
    norm_weight = layer.self_residual.norm.weight
    with plain_attribute_lookups(model):
        # Found in the instance dicts: Python's ordinary lookup never reaches nn.Module.__getattr__.
        assert layer.__dict__["self_attention"] is layer.self_attention
        assert layer.self_residual.norm.__dict__["weight"] is norm_weight
        copied = len(_registered_names_in_instance_dicts(model))
        assert copied == sum(len(module._parameters) + len(module._modules) for module in model.modules())
        with plain_attribute_lookups(model):  # a search within a search leaves them to the outer one
            pass
        assert len(_registered_names_in_instance_dicts(model)) == copied
        # An assignment inside replaces the copy, and the new parameter outlives the context.
        replacement = torch.nn.Parameter(torch.ones_like(norm_weight))
        layer.self_residual.norm.weight = replacement
        assert layer.self_residual.norm.weight is replacement
    assert _registered_names_in_instance_dicts(model) == []
    assert layer.self_residual.norm.weight is replacement and layer.self_residual.norm._parameters["weight"] is replacement
    with pytest.raises(RuntimeError, match="inside"), plain_attribute_lookups(model):
        raise RuntimeError("a search failing inside")
    assert _registered_names_in_instance_dicts(model) == []
    with plain_attribute_lookups(model):  # and the next search makes them again
        assert len(_registered_names_in_instance_dicts(model)) == copied


def test_every_search_runs_with_plain_lookups_and_threads_may_share_a_model():
    model = small_model().eval()
    layer = model.decoder_layers[0]
    seen = []
    decode = model.decode

    def recording_decode(*args, **kwargs):
        seen.append("self_attention" in layer.__dict__)
        return decode(*args, **kwargs)

    def recording_choice(log_probs):
        seen.append("self_attention" in layer.__dict__)
        return log_probs.argmax(dim=-1)

    src = random_source(2, 5)
    with patch.object(model, "decode", recording_decode):
        greedy_decode(model, src, exact_steps=3)
        beam_search(model, src, beam_size=3, exact_steps=3)
    greedy_search(model, src, exact_steps=3, choose=recording_choice)
    assert len(seen) == 9 and all(seen)
    assert _registered_names_in_instance_dicts(model) == []

    # Searches in several threads at once: the copies stay until the last one ends, and none fails.
    errors, interval = [], sys.getswitchinterval()
    expected = greedy_decode(model, src, exact_steps=2)

    def search_repeatedly():
        try:
            for _ in range(40):
                assert greedy_decode(model, src, exact_steps=2) == expected
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=search_repeatedly) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and _registered_names_in_instance_dicts(model) == []


def test_a_model_copied_during_a_search_sheds_the_copies_at_its_own_next_search():
    model = small_model().eval()
    copies = []

    def copy_then_choose(log_probs):
        copies.append(copy_module.deepcopy(model))
        return log_probs.argmax(dim=-1)

    src = random_source(2, 5)
    # Without packed weights: packed copies cannot be deep-copied, and a copy made in inference
    # mode holds inference tensors, which have no version counter to pack by.
    with without_packed_weights():
        greedy_search(model, src, exact_steps=1, choose=copy_then_choose)
        copied = copies[0]
        assert _registered_names_in_instance_dicts(copied) != []  # carried over from the search
        greedy_decode(copied, src, exact_steps=2)
    assert _registered_names_in_instance_dicts(copied) == []
    copied.decoder_norm.bias = None  # now seen, as in any module
    assert copied.decoder_norm.bias is None


needs_onednn_linear = pytest.mark.skipif(not fused_linear_relu_applies(torch.zeros(1), torch.zeros(1)),
                                         reason="this PyTorch has no usable oneDNN linear")


def test_feed_forward_is_linear_relu_linear():
    feed_forward = FeedForward(8, 16)
    x = torch.randn(3, 8)
    torch.testing.assert_close(feed_forward(x), torch.nn.Sequential.forward(feed_forward, x))
    assert isinstance(feed_forward[1], torch.nn.ReLU)


@needs_onednn_linear
def test_training_feed_forward_takes_the_fused_path_with_the_plain_values_and_gradients():
    torch.manual_seed(0)
    feed_forward = FeedForward(16, 64).train()
    x = torch.randn(3, 5, 16, requires_grad=True)
    calls = []
    with patch("attn_cli.model.transformer.linear_relu", side_effect=lambda *a: calls.append(1) or linear_relu(*a)):
        fused = feed_forward(x)
    assert calls == [1]
    plain = torch.nn.Sequential.forward(feed_forward, x)
    torch.testing.assert_close(fused, plain)
    hidden = feed_forward[0](x)
    assert (hidden < 0).any() and (hidden > 0).any()  # the ReLU cuts some hidden units and passes others
    grad = torch.randn_like(fused)
    parameters = [x, *feed_forward.parameters()]
    for got, expected in zip(torch.autograd.grad(fused, parameters, grad), torch.autograd.grad(plain, parameters, grad)):
        torch.testing.assert_close(got, expected)


@needs_onednn_linear
@pytest.mark.parametrize("wants", [(True, True, True), (True, False, False), (False, True, False), (False, False, True)])
@pytest.mark.parametrize("shape", [(4, 6, 16), (0, 16), "transposed"])
def test_linear_relu_matches_the_plain_layer_for_any_inputs_and_gradients_wanted(wants, shape):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 7, generator=generator).t() if shape == "transposed" else torch.randn(shape, generator=generator)
    inputs = [x, torch.randn(32, 16, generator=generator), torch.randn(32, generator=generator)]
    inputs = [tensor.requires_grad_(wanted) for tensor, wanted in zip(inputs, wants)]
    fused, plain = linear_relu(*inputs), torch.relu(torch.nn.functional.linear(*inputs))
    torch.testing.assert_close(fused, plain)
    wanted = [tensor for tensor in inputs if tensor.requires_grad]
    grad = torch.randn(plain.shape, generator=generator)
    for got, expected in zip(torch.autograd.grad(fused, wanted, grad), torch.autograd.grad(plain, wanted, grad)):
        torch.testing.assert_close(got, expected)


@needs_onednn_linear
def test_linear_relu_refuses_double_backward_rather_than_giving_wrong_second_derivatives():
    x, weight, bias = (torch.randn(shape, requires_grad=True) for shape in ((3, 4), (5, 4), (5,)))
    gradients = torch.autograd.grad(linear_relu(x, weight, bias).square().sum(), (x, weight), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        sum(gradient.sum() for gradient in gradients).backward()


def test_a_compiled_feed_forward_keeps_the_plain_path():
    feed_forward = FeedForward(8, 16).train()
    x = torch.randn(3, 8)
    compiled = torch.compile(feed_forward, backend="eager")
    with patch("attn_cli.model.transformer.linear_relu", side_effect=AssertionError("fused path taken")):
        torch.testing.assert_close(compiled(x), torch.nn.Sequential.forward(feed_forward, x))


@needs_onednn_linear
def test_linear_relu_gradients_pass_gradcheck():
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    # The oneDNN op is fp32 only; the autograd Function's backward is checked here through the
    # plain forward it must match, by swapping the op for F.linear + relu in float64.
    with patch.object(torch.ops.mkldnn, "_linear_pointwise",
                           lambda rows, w, b, *_: torch.relu(torch.nn.functional.linear(rows, w, b))):
        assert torch.autograd.gradcheck(linear_relu, (x, weight, bias))


def test_feed_forward_keeps_the_plain_path_under_autocast_and_outside_training():
    feed_forward = FeedForward(8, 16)
    x = torch.randn(3, 8)
    with patch("attn_cli.model.transformer.linear_relu", side_effect=AssertionError("fused path taken")):
        feed_forward.eval()(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert feed_forward.train()(x).dtype == torch.bfloat16
        feed_forward.double()(x.double())


def test_a_model_decodes_after_searches_as_a_fresh_copy_of_it_does():
    model = small_model(max_positions=8).eval()  # sinusoidal: the position table grows inside a search
    src = random_source(2, 6)
    first = greedy_decode(model, src, exact_steps=12), beam_search(model, src, beam_size=3, exact_steps=12)
    assert _registered_names_in_instance_dicts(model) == []
    assert all(linear._active is None for linear in model.modules() if isinstance(linear, Linear))
    norm = model.decoder_layers[0].self_residual.norm
    norm.weight = torch.nn.Parameter(torch.full_like(norm.weight, 2.0))  # replaced between searches
    fresh = small_model(max_positions=8).eval()
    fresh.load_state_dict(model.state_dict())
    again = greedy_decode(model, src, exact_steps=12), beam_search(model, src, beam_size=3, exact_steps=12)
    assert again == (greedy_decode(fresh, src, exact_steps=12), beam_search(fresh, src, beam_size=3, exact_steps=12))
    assert again != first


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


@pytest.mark.parametrize("rows", [1, 2, 5, 37, 160, 1000, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1])
@pytest.mark.parametrize("d_model", [256, 512])
def test_packed_weights_give_the_plain_products_at_every_row_count(rows, d_model):
    # MKL packs each weight for PACKED_FOR_ROWS rows; the products must not depend on that.
    torch.manual_seed(rows)
    layer = Linear(d_model, 3 * d_model).eval()
    x = torch.randn(rows, d_model)
    with torch.no_grad():
        plain = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double()).float()
        with inference_weights(layer):
            assert layer._active is not None
            torch.testing.assert_close(layer(x), plain, atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(layer(x.view(1, rows, d_model)), plain[None], atol=1e-4, rtol=1e-5)
            # Spoil the packed copy: only the row counts that use it may change, as 2-D or 3-D input.
            layer._active = PackedWeight().of(torch.zeros_like(layer.weight))
            spoiled = [layer(x), layer(x.view(1, rows, d_model))[0]]
    for output in spoiled:
        assert torch.allclose(output, plain, atol=1e-4, rtol=1e-5) == (rows > PACKED_MAX_ROWS)


def test_the_output_projection_uses_its_packed_copy():
    model = small_model().eval()
    src, tgt = random_source(2, 5), torch.randint(4, 50, (2, 3))
    with torch.no_grad(), inference_weights(model):
        plain = model(src, tgt)
        model._active_output = PackedWeight().of(torch.zeros_like(model.tgt_embedding.weight))
        assert torch.allclose(model(src, tgt), torch.zeros_like(plain)), "spoiled: every logit 0"


def test_a_weight_replaced_by_another_shape_at_the_same_address_is_packed_again():
    # The packed product takes its widths from the live weight: a copy packed for another shape
    # would be read out of bounds. Same storage, same version counter: only the shape differs.
    layer = Linear(64, 64).eval()
    with torch.no_grad():
        with inference_weights(layer):
            layer(torch.randn(3, 64))
        layer.weight.data = layer.weight.data.view(32, 128)
        layer.bias.data = torch.randn(32)
        x = torch.randn(3, 128)
        with inference_weights(layer):
            torch.testing.assert_close(layer(x), x @ layer.weight.t() + layer.bias, atol=1e-4, rtol=1e-5)


def test_a_wrong_input_width_is_an_error_with_packed_weights_too():
    layer = Linear(8, 4).eval()
    with torch.no_grad(), inference_weights(layer):
        with pytest.raises(RuntimeError, match="shape"):
            layer(torch.randn(3, 9))  # 27 elements: three "rows" of 8 and change


def test_a_model_that_has_decoded_can_still_be_copied_and_pickled():
    model = small_model().eval()
    src = random_source(2, 5)
    tokens = greedy_decode(model, src, exact_steps=4)
    assert model._packed_output.packed is not None
    buffer = io.BytesIO()
    torch.save(model, buffer)  # a packed copy has no storage: it must not travel with the module
    buffer.seek(0)
    for copy in (copy_module.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert copy._packed_output.packed is None
        assert greedy_decode(copy, src, exact_steps=4) == tokens


def test_inference_weights_leave_autocast_and_other_dtypes_alone():
    model = small_model().eval()
    with torch.no_grad(), inference_weights(model):
        assert model._active_output is not None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), inference_weights(model):
        assert model._active_output is None, "the packed copies would bypass autocast"
    model = model.double()
    with torch.no_grad(), inference_weights(model):
        assert model._active_output is None, "MKL packs float32 weights only"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_drops_a_share_p_and_keeps_the_expected_value(p, dtype):
    from attn_cli.model.transformer import dropout

    torch.manual_seed(0)
    x = torch.ones(1001, 999, dtype=dtype)  # an element count that four does not divide
    out = dropout(x, p).float()
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 3e-3
    assert torch.all(out[kept] == out[kept][0]) and abs(out[kept][0].item() * (1 - p) - 1) < 1e-2
    assert abs(out.mean().item() - 1) < 5e-3
    # Neighbouring elements (lanes of one draw) are independent: P(both kept) = (1 - p)^2.
    both = (kept[:, 0::2][:, :499] & kept[:, 1::2][:, :499]).float().mean().item()
    assert abs(both - (1 - p) ** 2) < 3e-3
    torch.manual_seed(0)
    assert torch.equal(dropout(x, p).float(), out), "the same seed gives the same mask"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_added_to_a_residual_is_the_residual_plus_the_same_dropout(dtype):
    from attn_cli.model.transformer import dropout

    x, residual = torch.randn(64, 33, dtype=dtype), torch.randn(64, 33)
    torch.manual_seed(1)
    fused = dropout(x, 0.3, residual=residual)
    torch.manual_seed(1)
    separate = residual + dropout(x.float(), 0.3)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, separate, atol=1e-6, rtol=1e-6)
