"""Attention inspection: the collected weights are the model's real ones, and every view of them is labelled right."""

import json
import sys
import warnings

import pytest
import torch
from rich.console import Console
from support.models import random_source, small_model

from attn_cli.decoding.attention_view import (
    KINDS,
    AttentionMaps,
    collect_attention,
    render_alignment,
    save_attention,
)
from attn_cli.vocab import BOS_ID

OUTPUT_IDS = [7, 11, 13, 17, 19]
SOURCE_TOKENS = ["▁a", "[b]", "你", "好", "$$"]  # "[b]" is Rich markup, "$$" broken matplotlib mathtext
TARGET_TOKENS = ["▁I", "am", "你好", "x", "?"]


@pytest.fixture
def model():
    return small_model(decoder_layers=3)


@pytest.fixture
def maps(model):
    return collect_attention(model, random_source(1, 6)[0].tolist(), OUTPUT_IDS)


def test_shapes_are_layers_heads_queries_keys(maps):
    assert maps.encoder.shape == (2, 4, 6, 6)
    assert maps.decoder_self.shape == (3, 4, 6, 6)  # BOS + 5 outputs
    assert maps.cross.shape == (3, 4, 6, 6)


def test_causal_self_attention_is_exactly_zero_above_the_diagonal(maps):
    for layer in maps.decoder_self:
        for head in layer:
            assert torch.all(head.triu(diagonal=1) == 0.0)
            visible = torch.ones_like(head, dtype=torch.bool).tril()
            assert torch.all(head[visible] > 0)  # and the visible prefix is really attended to


def test_every_row_of_every_kind_sums_to_one(maps):
    for kind in KINDS:
        sums = getattr(maps, kind).sum(dim=-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def test_encoder_gives_padding_keys_exactly_zero_weight(model):
    src = random_source(2, 6, lengths=[6, 3])
    attention = {}
    model.encode(src, attention=attention)
    assert len(attention["encoder"]) == 2
    for weights in attention["encoder"]:  # (B, heads, S, S)
        assert torch.all(weights[1, :, :, 3:] == 0.0)
        assert torch.all(weights[1, :, :, :3] > 0) and torch.all(weights[0] > 0)


def test_teacher_forced_weights_equal_the_weights_of_cached_incremental_decoding(model):
    src_ids = random_source(1, 7)[0].tolist()
    maps = collect_attention(model, src_ids, OUTPUT_IDS)
    with torch.inference_mode():
        encoded = model.encode(torch.tensor([src_ids]))
        cache = model.new_cache()
        tokens = torch.tensor([[BOS_ID]])
        for step, next_id in enumerate(OUTPUT_IDS + [None]):  # the last step is the one that emits EOS
            step_weights = {}
            model.decode(tokens[:, -1:], encoded, cache, attention=step_weights)
            cross = torch.cat(step_weights["cross"])  # (layers, heads, 1, S)
            own = torch.cat(step_weights["decoder_self"])  # (layers, heads, 1, step + 1)
            torch.testing.assert_close(maps.cross[:, :, step], cross[:, :, 0], atol=1e-5, rtol=0)
            torch.testing.assert_close(maps.decoder_self[:, :, step, : step + 1], own[:, :, 0], atol=1e-5, rtol=0)
            if next_id is not None:
                tokens = torch.cat([tokens, torch.tensor([[next_id]])], dim=1)
    assert step == len(OUTPUT_IDS)
    # The comparison could tell rows apart: neighbouring steps attend differently.
    assert (maps.cross[:, :, 1:] - maps.cross[:, :, :-1]).abs().max() > 1e-3


def test_collect_restores_training_mode_and_rejects_a_source_without_eos(model):
    model.train()
    collect_attention(model, [5, 6, 3], [7])
    assert model.training
    with pytest.raises(ValueError, match="EOS"):
        collect_attention(model, [5, 6], [7])


def test_json_round_trip_keeps_shapes_labels_and_weights(maps, tmp_path):
    path = tmp_path / "nested" / "dir" / "attention.json"
    save_attention(path, maps, SOURCE_TOKENS, TARGET_TOKENS)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["source_tokens"] == SOURCE_TOKENS + ["</s>"]
    assert saved["decoder_input_tokens"] == ["<s>"] + TARGET_TOKENS
    assert saved["output_tokens"] == TARGET_TOKENS + ["</s>"]
    for kind in KINDS:
        expected = getattr(maps, kind)
        restored = torch.tensor(saved[kind])
        assert restored.shape == expected.shape  # layers x heads x queries x keys, as nested lists
        torch.testing.assert_close(restored, expected, atol=1e-6, rtol=0)


def test_labels_must_match_the_weights(maps, tmp_path):
    with pytest.raises(ValueError, match="5 source and 5 target tokens"):
        save_attention(tmp_path / "a.json", maps, SOURCE_TOKENS + ["</s>"], TARGET_TOKENS)


@pytest.mark.slow  # matplotlib renders a figure
def test_png_is_written_without_glyph_warnings(maps, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "figures" / "attention.png"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_attention(path, maps, SOURCE_TOKENS, TARGET_TOKENS)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    assert not [w for w in caught if "Glyph" in str(w.message)]


def test_png_without_matplotlib_says_how_to_install_it(maps, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(Exception, match=r"pip install 'attn-cli\[plot\]'"):
        save_attention(tmp_path / "a.png", maps, SOURCE_TOKENS, TARGET_TOKENS)
    assert not (tmp_path / "a.png").exists()


def _render(*args, **kwargs) -> str:
    console = Console(record=True, width=200)
    console.print(render_alignment(*args, **kwargs))
    return console.export_text()


def test_alignment_grid_names_every_source_and_target_token(maps):
    text = _render(maps, SOURCE_TOKENS, TARGET_TOKENS)
    header = next(line for line in text.splitlines() if "▁a" in line)
    assert header.split() == SOURCE_TOKENS + ["</s>"]  # the source across, in order
    rows = [line.split()[0] for line in text.splitlines()[text.splitlines().index(header) + 1 :][:6]]
    assert rows == TARGET_TOKENS + ["</s>"]  # the emitted tokens down, in order
    assert "decoder layer 2 of 3, mean of 4 heads" in text


def _grid_rows(text: str) -> list[str]:
    """The shade cells of each row of a rendered 2 x 2 grid, e.g. ["█·", "·█", ...]."""
    return [
        "".join(line.split()[1:])[::2] for line in text.splitlines() if line.split()[:1] in (["x"], ["y"], ["</s>"])
    ]


def test_alignment_grid_shades_the_chosen_layer_and_head():
    # 2 layers, 2 heads, 3 emitted tokens (x, y, </s>) by 2 source tokens (a, </s>).
    cross = torch.zeros(2, 2, 3, 2)
    cross[1, 0] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    cross[1, 1] = 1 - cross[1, 0]
    cross[0] = 0.5
    maps = AttentionMaps(encoder=torch.zeros(1, 2, 2, 2), decoder_self=torch.zeros(2, 2, 3, 3), cross=cross)
    assert _grid_rows(_render(maps, ["a"], ["x", "y"], head=0)) == ["█·", "·█", "█·"]
    assert _grid_rows(_render(maps, ["a"], ["x", "y"], layer=1, head=1)) == ["·█", "█·", "·█"]
    assert _grid_rows(_render(maps, ["a"], ["x", "y"])) == ["▒▒"] * 3  # mean over the two heads
    assert _grid_rows(_render(maps, ["a"], ["x", "y"], layer=0, head=-1)) == ["▒▒"] * 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer": 3}, "--attention-layer 3: the model has 3 decoder layers (0..2, or -1 for the last)"),
        ({"layer": -4}, "--attention-layer -4: the model has 3 decoder layers (0..2"),
        ({"head": 4}, "--attention-head 4: the model has 4 heads (0..3"),
    ],
)
def test_a_layer_or_head_the_model_lacks_names_the_valid_range(maps, kwargs, message):
    with pytest.raises(ValueError) as error:
        render_alignment(maps, SOURCE_TOKENS, TARGET_TOKENS, **kwargs)
    assert message in str(error.value)
