"""A checkpoint as a CTranslate2 model directory that translates on its own.

The directory holds CTranslate2's files (model.bin, config.json, the vocabularies), the
SentencePiece models in tokenizer/ and the checkpoint's config as attn.yaml. The weights map one to
one onto CTranslate2's Transformer: attn's fused query/key/value projections are the fused ones it
expects, the √d_model embedding scale is its `scale_embeddings`, and the position table is written
out as attn computes it (attn interleaves sin and cos; CTranslate2's built-in table does not).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from attn_cli.config import Config, config_to_yaml
from attn_cli.data.lengths import LengthModel
from attn_cli.data.tokenizer import Tokenizer, Tokenizers
from attn_cli.engines.ctranslate2 import (
    CONFIG_FILE,
    LENGTHS_FILE,
    TOKENIZER_DIR,
    ExportError,
    import_ctranslate2,
    position_rows,
)
from attn_cli.files import directory_built_whole, require_new_directory, write_whole
from attn_cli.model import Transformer
from attn_cli.vocab import BOS_ID, EOS_ID, UNK_ID

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float32", "float16", "bfloat16")
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's
# Position schemes whose vectors can be written out as a table added to the embeddings.
EXPORTABLE_POSITIONS = ("sinusoidal", "learned")


def export(
    config: Config,
    tokenizers: Tokenizers,
    model: Transformer,
    output: Path,
    quantization: str,
    lengths: Optional[LengthModel] = None,
) -> None:
    """Write the model as a CTranslate2 directory at `output`, which must not exist or be empty, with
    its training pairs' `lengths` when known (they bound its outputs as they bound a checkpoint's).
    It is built beside `output` and renamed into place, so an interrupted export leaves nothing."""
    ctranslate2 = import_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise ExportError(
            f"--quantization {quantization!r} is not one CTranslate2 offers; use one of {', '.join(QUANTIZATIONS)}"
        )
    require_new_directory(output)
    if config.model.positions not in EXPORTABLE_POSITIONS:
        raise ExportError(
            f"model.positions {config.model.positions!r} has no CTranslate2 equivalent that adds "
            f"positions as attn does; export works for {' and '.join(EXPORTABLE_POSITIONS)} positions"
        )
    spec = transformer_spec(config, tokenizers, model, ctranslate2)
    with directory_built_whole(output) as building:  # renamed over an empty `output`, as POSIX allows
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(str(building))
        tokenizers.save(building / TOKENIZER_DIR)
        write_whole(building / CONFIG_FILE, config_to_yaml(config))
        if lengths is not None:
            write_whole(building / LENGTHS_FILE, json.dumps({"counts": lengths.counts.tolist()}) + "\n")


def transformer_spec(config: Config, tokenizers: Tokenizers, model: Transformer, ctranslate2):
    """CTranslate2's description of `model`, with every weight set."""
    from ctranslate2.specs import transformer_spec as specs

    layers = (len(model.encoder_layers), len(model.decoder_layers))
    # model.activation's counterparts: CTranslate2's GELU is the exact (erf) form, as torch's nn.GELU.
    activations = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}
    spec = specs.TransformerSpec.from_config(
        layers,
        config.model.num_heads,
        pre_norm=config.model.norm == "pre",
        activation=getattr(ctranslate2.specs.Activation, activations[config.model.activation]),
    )
    # Copies: CTranslate2 quantizes the arrays it is given in place, and these must not be the model's own.
    weights = {name: tensor.detach().float().cpu().numpy().copy() for name, tensor in model.state_dict().items()}
    positions = _position_table(model, config)
    _set_stack(spec.encoder, weights, "encoder", "src_embedding", positions, model.d_model, cross=False)
    _set_stack(spec.decoder, weights, "decoder", "tgt_embedding", positions, model.d_model, cross=True)
    spec.decoder.projection.weight = weights["tgt_embedding.weight"]  # tied to the target embedding
    vocabulary = weights["tgt_embedding.weight"].shape[0]
    spec.decoder.projection.bias = weights.get("output_bias", np.zeros(vocabulary, dtype=np.float32))

    source, target = tokenizers.source, tokenizers.target
    spec.register_source_vocabulary(_pieces(source))
    spec.register_target_vocabulary(_pieces(target))
    special = target.id_to_piece([UNK_ID, BOS_ID, EOS_ID])
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = special
    spec.config.decoder_start_token = special[1]  # attn's decoder starts from BOS
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    # attn's sources end in EOS: CTranslate2 adds it, so that any client (Argos Translate among them)
    # translates the SentencePiece pieces of a sentence as attn does.
    spec.config.add_source_eos = True
    return spec


def _pieces(tokenizer: Tokenizer) -> list[str]:
    return tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))


def _position_table(model: Transformer, config: Config) -> dict[str, np.ndarray]:
    """Each side's position vectors, row p for position p, exactly as the model adds them."""
    rows = position_rows(config)
    with torch.no_grad():
        return {side: getattr(model, f"{side}_positions")(0, rows).float().cpu().numpy() for side in ("src", "tgt")}


def _set_stack(
    stack,
    weights: dict[str, np.ndarray],
    side: str,
    embedding: str,
    positions: dict[str, np.ndarray],
    d_model: int,
    cross: bool,
) -> None:
    embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
    embeddings.weight = weights[f"{embedding}.weight"]
    stack.scale_embeddings = True  # x √d_model, as attn
    stack.position_encodings.encodings = positions["src" if side == "encoder" else "tgt"]
    if hasattr(stack, "layer_norm"):  # pre-LN stacks end with a LayerNorm
        _set_norm(stack.layer_norm, weights, f"{side}_norm")
    for index, layer in enumerate(stack.layer):
        prefix = f"{side}_layers.{index}"
        self_residual = "self_residual" if cross else "attention_residual"
        _set_attention(layer.self_attention, weights, f"{prefix}.self_attention", ["qkv_proj", "out_proj"])
        _set_norm(layer.self_attention.layer_norm, weights, f"{prefix}.{self_residual}.norm")
        if cross:
            _set_attention(layer.attention, weights, f"{prefix}.cross_attention", ["q_proj", "kv_proj", "out_proj"])
            _set_norm(layer.attention.layer_norm, weights, f"{prefix}.cross_residual.norm")
        _set_linear(layer.ffn.linear_0, weights, f"{prefix}.feed_forward.0")
        _set_linear(layer.ffn.linear_1, weights, f"{prefix}.feed_forward.2")
        _set_norm(layer.ffn.layer_norm, weights, f"{prefix}.feed_forward_residual.norm")


def _set_attention(attention, weights: dict[str, np.ndarray], prefix: str, projections: list[str]) -> None:
    # attn's fused projections lay out their rows as CTranslate2's: queries, keys, values.
    for linear, name in zip(attention.linear, projections):
        _set_linear(linear, weights, f"{prefix}.{name}")


def _set_linear(linear, weights: dict[str, np.ndarray], prefix: str) -> None:
    linear.weight, linear.bias = weights[f"{prefix}.weight"], weights[f"{prefix}.bias"]


def _set_norm(norm, weights: dict[str, np.ndarray], prefix: str) -> None:
    norm.gamma, norm.beta = weights[f"{prefix}.weight"], weights[f"{prefix}.bias"]
