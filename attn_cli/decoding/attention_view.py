"""Attention inspection for one translated sentence: collect, draw in the terminal, save to a file.

The weights come from re-running the model teacher-forced on a finished translation, which gives
every decoder step's attention in one pass (the same weights incremental decoding computed step by
step). Decoder query i is the state that emits output token i, so the rows of the decoder grids are
labelled with the emitted tokens (outputs + "</s>"), while decoder self-attention keys are the
decoder inputs ("<s>" + outputs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Group
from rich.table import Table
from rich.text import Text

from attn_cli.errors import UserError
from attn_cli.files import write_whole, written_whole
from attn_cli.model import Transformer
from attn_cli.model.transformer import AttentionWeights
from attn_cli.vocab import BOS_ID, EOS_ID

KINDS = ("encoder", "decoder_self", "cross")
BOS, EOS = "<s>", "</s>"


class AttentionViewError(UserError, ValueError):
    """A layer or head the model does not have: a ValueError, shown by the CLI as one line."""


@dataclass
class AttentionMaps:
    """The attention weights of one sentence, float32 on the CPU, each (layers, heads, queries, keys)."""

    encoder: torch.Tensor  # (encoder layers, heads, S, S), S = source length with EOS
    decoder_self: torch.Tensor  # (decoder layers, heads, T, T), T = outputs + 1
    cross: torch.Tensor  # (decoder layers, heads, T, S)


def collect_attention(model: Transformer, src_ids: list[int], output_ids: list[int]) -> AttentionMaps:
    """Teacher-force `output_ids` (no BOS/EOS) on `src_ids` (ending in EOS) and keep every weight."""
    if not src_ids or src_ids[-1] != EOS_ID:
        raise ValueError("src_ids must end with EOS")
    device = next(model.parameters()).device
    src = torch.tensor(src_ids, device=device)
    tgt_in = torch.tensor([BOS_ID, *output_ids], device=device)
    weights: AttentionWeights = {}
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            model.decode(tgt_in[None], model.encode(src[None], attention=weights), attention=weights)
    finally:
        model.train(was_training)
    # per kind, layers x (1, heads, queries, keys) -> (layers, heads, queries, keys)
    return AttentionMaps(**{kind: torch.cat(weights[kind]).float().cpu() for kind in KINDS})


def numbered_path(path: Path, number: int) -> Path:
    """The file of input line `number` when several are saved: attention.json -> attention.0.json."""
    return path.with_name(f"{path.stem}.{number}{path.suffix}")


def _labels(maps: AttentionMaps, source_tokens: Sequence[str], target_tokens: Sequence[str]):
    """The three token axes: source (+ EOS), decoder inputs (BOS +), emitted tokens (+ EOS)."""
    queries, keys = maps.cross.shape[-2:]
    if len(source_tokens) != keys - 1 or len(target_tokens) != queries - 1:
        raise ValueError(
            f"expected {keys - 1} source and {queries - 1} target tokens without <s> and </s>, "
            f"got {len(source_tokens)} and {len(target_tokens)}"
        )
    return [*source_tokens, EOS], [BOS, *target_tokens], [*target_tokens, EOS]


def _check_index(flag: str, value: int, count: int, what: str, otherwise: str) -> int:
    """`value` as a non-negative index below `count`; negative values count from the end."""
    if not -count <= value < count:
        raise AttentionViewError(f"{flag} {value}: the model has {count} {what} (0..{count - 1}, or {otherwise})")
    return value % count


# Weight 0..1 -> one of five shades; the characters alone keep the grid readable without colour.
_SHADES = "·░▒▓█"


def _cell(weight: float) -> Text:
    level = min(len(_SHADES) - 1, round(weight * (len(_SHADES) - 1)))
    # grey (weight 0) to bright blue (weight 1)
    red, green, blue = (round(a + (b - a) * weight) for a, b in zip((90, 90, 90), (40, 140, 255)))
    return Text(_SHADES[level] * 2, style=f"rgb({red},{green},{blue})")


def render_alignment(
    maps: AttentionMaps,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    layer: int = -1,
    head: int | None = None,
) -> Group:
    """The cross-attention of one decoder layer as a grid: a row per emitted token, a column per
    source token; `head=None` averages the heads, which is what alignment views usually show."""
    sources, _, outputs = _labels(maps, source_tokens, target_tokens)
    layers, heads = maps.cross.shape[:2]
    layer = _check_index("--attention-layer", layer, layers, "decoder layers", "-1 for the last")
    if head is None:
        grid, which = maps.cross[layer].mean(dim=0), f"mean of {heads} heads"  # (T, S)
    else:
        head = _check_index("--attention-head", head, heads, "heads", "none for the mean over heads")
        grid, which = maps.cross[layer, head], f"head {head}"
    table = Table(box=None, padding=(0, 1))
    table.add_column("")
    for token in sources:  # Text, not str: tokens such as "[b]" are not Rich markup
        table.add_column(Text(token), justify="center")
    for token, row in zip(outputs, grid.tolist()):
        table.add_row(Text(token, style="bold"), *(_cell(weight) for weight in row))
    legend = "  ".join(f"{shade} ≈{index / (len(_SHADES) - 1):g}" for index, shade in enumerate(_SHADES))
    # Title and legend outside the table, which would wrap them to the width of a short sentence.
    return Group(Text(f"cross-attention, decoder layer {layer} of {layers}, {which}"), table, Text(legend, style="dim"))


def attention_payload(
    maps: AttentionMaps, source_tokens: Sequence[str], target_tokens: Sequence[str], decimals: int = 6
) -> dict:
    """Every weight and token label as plain lists: what `--attention FILE.json` writes and a server sends."""
    sources, inputs, outputs = _labels(maps, source_tokens, target_tokens)
    payload = {"source_tokens": sources, "decoder_input_tokens": inputs, "output_tokens": outputs}
    for kind in KINDS:  # float64 before rounding, so the JSON holds 0.123457 and not 0.12345699965
        payload[kind] = getattr(maps, kind).double().round(decimals=decimals).tolist()
    return payload


def word_alignment(maps: AttentionMaps) -> list[tuple[int, int]]:
    """(output token, source token) pairs: each output token (its EOS aside) with the source token
    (the source's EOS aside) it attends to most in the last decoder layer, averaged over heads,
    the layer most alignment methods read."""
    cross = maps.cross[-1].mean(dim=0)[:-1, :-1]  # (heads, T, S) -> (outputs, source tokens)
    if cross.numel() == 0:
        return []
    return [(target, int(source)) for target, source in enumerate(cross.argmax(dim=1).tolist())]


def save_attention(
    path: str | Path, maps: AttentionMaps, source_tokens: Sequence[str], target_tokens: Sequence[str]
) -> None:
    """Write a heatmap figure if `path` ends in .png, else JSON with every weight and token label."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".png":
        _save_png(path, maps, *_labels(maps, source_tokens, target_tokens))
        return
    write_whole(path, json.dumps(attention_payload(maps, source_tokens, target_tokens), ensure_ascii=False) + "\n")


def _save_png(path: Path, maps: AttentionMaps, sources: list[str], inputs: list[str], outputs: list[str]) -> None:
    """A grid of heatmaps, a row per kind and a column per layer, each the mean over heads."""
    try:
        from matplotlib import font_manager, ft2font
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError(f"writing {path} needs matplotlib: pip install 'attn-cli[plot]'") from None
    # Default fonts often lack CJK glyphs; a token the font cannot draw is labelled #position instead
    # of with empty boxes and a "Glyph ... missing from font" warning per character.
    charmap = ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap()

    def drawable(token: str) -> bool:
        return all(ord(character) in charmap for character in token)

    def tick_labels(tokens: list[str]) -> list[str]:  # "$" would start mathtext
        return [token.replace("$", r"\$") if drawable(token) else f"#{index}" for index, token in enumerate(tokens)]

    axes_labels = {"encoder": (sources, sources), "decoder_self": (outputs, inputs), "cross": (outputs, sources)}
    columns = max(getattr(maps, kind).shape[0] for kind in KINDS)
    side = max(2.5, 0.3 * max(len(sources), len(inputs)))  # inches per panel
    figure = Figure(figsize=(side * columns + 1, side * len(KINDS)), layout="constrained")
    panels = figure.subplots(len(KINDS), columns, squeeze=False)
    for row, kind in enumerate(KINDS):
        weights = getattr(maps, kind)
        queries, keys = (tick_labels(tokens) for tokens in axes_labels[kind])
        for column, ax in enumerate(panels[row]):
            if column >= weights.shape[0]:  # encoder and decoder may have different depths
                ax.set_visible(False)
                continue
            image = ax.imshow(weights[column].mean(dim=0).numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
            ax.set_title(f"{kind}, layer {column}", fontsize=9)
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
            ax.set_yticks(range(len(queries)), queries, fontsize=7)
    if not all(drawable(token) for token in sources + inputs):  # outputs are inputs[1:] + EOS
        figure.suptitle("#n: token n, which the default font cannot draw", fontsize=8)
    figure.colorbar(image, ax=panels, shrink=0.6, label="attention weight (mean over heads)")
    with written_whole(path, binary=True) as handle:
        figure.savefig(handle, format="png", dpi=120)
