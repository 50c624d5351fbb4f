"""How an attn model and a Hugging Face Marian model (MarianMTModel, the OPUS-MT models) correspond:
the config keys, the weight names, and the order of the vocabulary. Import and export both read it
from here, so that the one undoes the other exactly.

Marian is attn's post-LN Transformer with `model.sinusoid_layout: halves`, `model.activation: silu`
(OPUS-MT's; relu and gelu map too), `model.output_bias: true` and shared, scaled embeddings. Its
vocabulary (vocab.json) numbers end of sentence, unknown piece and padding its own way, and its
decoder starts from the padding id; attn's special ids are fixed (`attn_cli.vocab`). So the rows
are reordered: attn id 0 (padding) is a zero row of its own, 1 is Marian's <unk>, 2 (attn's start
of sentence) Marian's decoder start, 3 Marian's </s>, and every other Marian id follows in
Marian's order. An attn vocabulary is one row longer than the Marian one it comes from or goes to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attn_cli.config import ModelConfig
from attn_cli.errors import UserError
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# model.activation -> config.json's activation_function, and the names Transformers reads as each.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "swish"}
_ACTIVATION_OF = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}


class MarianError(UserError, ValueError):
    """A model that attn and Marian cannot both represent exactly; the message says which setting."""


@dataclass(frozen=True)
class MarianIds:
    """Marian's special ids, as config.json and vocab.json give them."""

    eos: int
    unk: int
    pad: int
    decoder_start: int


def attn_rows(marian_size: int, ids: MarianIds) -> list[Optional[int]]:
    """For each attn id, the Marian id whose row it takes (None: attn's padding, a zero row)."""
    special = {ids.eos, ids.unk, ids.pad, ids.decoder_start}
    rest = [i for i in range(marian_size) if i not in special]
    rows: list[Optional[int]] = [None] * 4
    rows[UNK_ID], rows[BOS_ID], rows[EOS_ID] = ids.unk, ids.decoder_start, ids.eos
    return rows + rest


def marian_rows(attn_size: int) -> list[int]:
    """For each Marian id of an exported model, the attn id whose row it takes: </s> 0, <unk> 1,
    attn's pieces in order, and last the padding, which is also the decoder start (attn's BOS):
    the layout of the OPUS-MT models, which `attn_rows` maps back."""
    return [EOS_ID, UNK_ID, *range(4, attn_size), BOS_ID]


def exported_ids(attn_size: int) -> MarianIds:
    last = len(marian_rows(attn_size)) - 1
    return MarianIds(eos=0, unk=1, pad=last, decoder_start=last)


def model_config_of(hf: dict, dropout: Optional[float] = None) -> ModelConfig:
    """attn's model keys for a Marian config.json, or a MarianError naming what attn cannot represent."""

    def same(first: str, second: str):
        if hf[first] != hf[second]:
            raise MarianError(f"config.json has {first}={hf[first]} but {second}={hf[second]}; attn needs them equal")
        return hf[first]

    if hf.get("model_type") != "marian":
        raise MarianError(
            f"config.json is a {hf.get('model_type')!r} model; attn imports Marian models (model_type marian)"
        )
    checks = [
        (hf.get("scale_embedding", False), "scale_embedding is false; attn scales embeddings by sqrt(d_model)"),
        (hf.get("share_encoder_decoder_embeddings", True), "the encoder and decoder have separate vocabularies"),
        (hf.get("tie_word_embeddings", True), "the output layer is not tied to the embeddings"),
        (hf.get("activation_function") in _ACTIVATION_OF, f"activation_function {hf.get('activation_function')!r}"),
        (not hf.get("normalize_before", False), "normalize_before (pre-LN) is a different layer order"),
    ]
    for fine, why in checks:
        if not fine:
            raise MarianError(f"attn cannot represent this model exactly: {why}")
    return ModelConfig(
        d_model=hf["d_model"],
        num_heads=same("encoder_attention_heads", "decoder_attention_heads"),
        ffn_dim=same("encoder_ffn_dim", "decoder_ffn_dim"),
        encoder_layers=hf["encoder_layers"],
        decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1) if dropout is None else dropout,
        attention_dropout=hf.get("attention_dropout", 0.0),
        positions="sinusoidal",
        max_positions=hf.get("max_position_embeddings", 512),
        sinusoid_layout="halves",
        norm="post",
        activation=_ACTIVATION_OF[hf["activation_function"]],
        share_embeddings=True,
        output_bias=True,
    )


def refusal(model: ModelConfig, tokenizers_joint: bool) -> Optional[str]:
    """Why an attn model has no exact Marian counterpart, in one line; None when it has one."""
    exportable = (
        "Transformers' Marian exports models with model.norm: post, model.positions: sinusoidal, "
        "model.sinusoid_layout: halves, model.share_embeddings: true and a joint tokenizer"
    )
    problems = [
        (model.norm != "post", "model.norm is pre (pre-LN), and Marian's layers normalise after each residual sum"),
        (model.positions != "sinusoidal", f"model.positions is {model.positions}, and Marian's are sinusoidal"),
        (model.sinusoid_layout != "halves", "model.sinusoid_layout is interleaved, and Marian puts sines first"),
        (not model.share_embeddings or not tokenizers_joint, "the model has two vocabularies, and Marian one"),
    ]
    for wrong, why in problems:
        if wrong:
            return f"cannot export to Transformers: {why}; {exportable}"
    return None


def marian_config(model: ModelConfig, attn_size: int) -> dict:
    """config.json for an attn model that `refusal` accepts."""
    ids = exported_ids(attn_size)
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": attn_size - 1,
        "decoder_vocab_size": attn_size - 1,
        "d_model": model.d_model,
        "encoder_layers": model.encoder_layers,
        "decoder_layers": model.decoder_layers,
        "encoder_attention_heads": model.num_heads,
        "decoder_attention_heads": model.num_heads,
        "encoder_ffn_dim": model.ffn_dim,
        "decoder_ffn_dim": model.ffn_dim,
        "activation_function": ACTIVATIONS[model.activation],
        "dropout": model.dropout,
        "attention_dropout": model.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": model.max_positions,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "pad_token_id": ids.pad,
        "eos_token_id": ids.eos,
        "decoder_start_token_id": ids.decoder_start,
        "forced_eos_token_id": ids.eos,
    }


# -- weights ------------------------------------------------------------------------------------------
# Per layer, attn's name -> Marian's (the part after "model.encoder.layers.N." or "...decoder..."):
# attn fuses the query, key and value projections, Marian keeps them apart (listed in fused order).
_ENCODER_LAYER = {
    "self_attention.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.out_proj": ("self_attn.out_proj",),
    "attention_residual.norm": ("self_attn_layer_norm",),
    "feed_forward.0": ("fc1",),
    "feed_forward.2": ("fc2",),
    "feed_forward_residual.norm": ("final_layer_norm",),
}
_DECODER_LAYER = {
    "self_attention.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.out_proj": ("self_attn.out_proj",),
    "self_residual.norm": ("self_attn_layer_norm",),
    "cross_attention.q_proj": ("encoder_attn.q_proj",),
    "cross_attention.kv_proj": ("encoder_attn.k_proj", "encoder_attn.v_proj"),
    "cross_attention.out_proj": ("encoder_attn.out_proj",),
    "cross_residual.norm": ("encoder_attn_layer_norm",),
    "feed_forward.0": ("fc1",),
    "feed_forward.2": ("fc2",),
    "feed_forward_residual.norm": ("final_layer_norm",),
}


def _layer_names(model: ModelConfig):
    """(attn prefix, Marian prefix, name table) for every layer."""
    for side, count, table in (
        ("encoder", model.encoder_layers, _ENCODER_LAYER),
        ("decoder", model.decoder_layers, _DECODER_LAYER),
    ):
        for index in range(count):
            yield f"{side}_layers.{index}.", f"model.{side}.layers.{index}.", table


def attn_weights(
    marian: dict[str, torch.Tensor], model: ModelConfig, ids: MarianIds, marian_size: int
) -> dict[str, torch.Tensor]:
    """attn's state dict from a Marian one (names with or without the leading "model.")."""
    # A MarianModel's names lack the leading "model." that a MarianMTModel's have.
    kept = ("model.", "final_logits_bias", "lm_head.")
    marian = {name if name.startswith(kept) else f"model.{name}": tensor for name, tensor in marian.items()}
    embedding = _first(marian, "model.shared.weight", "model.encoder.embed_tokens.weight")
    if "lm_head.weight" in marian and not torch.equal(marian["lm_head.weight"], embedding):
        raise MarianError("attn cannot represent this model exactly: lm_head.weight is not the shared embedding")
    if embedding.shape[0] != marian_size:
        raise MarianError(
            f"the embedding has {embedding.shape[0]:,} rows and config.json's vocab_size is {marian_size:,}; "
            f"the weights and the config are of different models"
        )
    rows = attn_rows(embedding.shape[0], ids)
    bias = marian.get("final_logits_bias", torch.zeros(1, embedding.shape[0])).reshape(-1)
    state = {"tgt_embedding.weight": _take_rows(embedding, rows), "output_bias": _take_rows(bias, rows)}
    state["src_embedding.weight"] = state["tgt_embedding.weight"]
    for attn_prefix, marian_prefix, table in _layer_names(model):
        for ours, theirs in table.items():
            for kind in ("weight", "bias"):
                parts = [_first(marian, f"{marian_prefix}{name}.{kind}") for name in theirs]
                state[f"{attn_prefix}{ours}.{kind}"] = torch.cat(parts) if len(parts) > 1 else parts[0]
    return {name: tensor.float().contiguous() for name, tensor in state.items()}


def marian_weights(state: dict[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    """A Marian state dict from attn's (the shared embedding once: Transformers ties the rest to it)."""
    embedding = state["tgt_embedding.weight"]
    rows = marian_rows(embedding.shape[0])
    bias = state.get("output_bias", torch.zeros(embedding.shape[0]))
    out = {"model.shared.weight": embedding[rows], "final_logits_bias": bias[rows].reshape(1, -1)}
    for attn_prefix, marian_prefix, table in _layer_names(model):
        for ours, theirs in table.items():
            for kind in ("weight", "bias"):
                fused = state[f"{attn_prefix}{ours}.{kind}"]
                for name, part in zip(theirs, fused.chunk(len(theirs))):
                    out[f"{marian_prefix}{name}.{kind}"] = part
    return {name: tensor.detach().float().cpu().contiguous() for name, tensor in out.items()}


def _take_rows(tensor: torch.Tensor, rows: list[Optional[int]]) -> torch.Tensor:
    """tensor's rows in attn's order; attn's padding row is zeros, as attn keeps it."""
    picked = tensor[[PAD_ID if row is None else row for row in rows]].clone()
    picked[PAD_ID] = 0
    return picked


def _first(weights: dict[str, torch.Tensor], *names: str) -> torch.Tensor:
    for name in names:
        if name in weights:
            return weights[name]
    raise MarianError(f"the weights have no {names[0]}; is this a complete MarianMTModel checkpoint?")
