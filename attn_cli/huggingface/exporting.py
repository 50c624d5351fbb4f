"""`attn export --format hf`: an attn model as a Transformers Marian directory, with a model card.

`MarianMTModel.from_pretrained`, `MarianTokenizer.from_pretrained` and
`transformers.pipeline("translation", DIR)` load what it writes: config.json,
generation_config.json, model.safetensors, source.spm, target.spm, vocab.json,
tokenizer_config.json, and README.md, the model card the Hub shows (data, licence, config, scores,
training). Only models that Marian represents exactly are exported (`marian.refusal`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from attn_cli.checkpoint import Checkpoint
from attn_cli.data.builtin_corpora import corpus_readme
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.errors import UserError
from attn_cli.files import directory_built_whole, require_new_directory, write_whole
from attn_cli.huggingface.marian import MarianError, exported_ids, marian_config, marian_rows, marian_weights, refusal
from attn_cli.vocab import BOS_ID, EOS_ID, UNK_ID

# The names the exported vocab.json gives attn's special ids (Marian's: attn's BOS is its padding).
_MARIAN_PIECES = {EOS_ID: "</s>", UNK_ID: "<unk>", BOS_ID: "<pad>"}


def export_marian(
    checkpoint: Checkpoint, output: Path, scores: Sequence = (), test_source: Optional[Path] = None
) -> None:
    """Write `output` (new, or empty) from `checkpoint`; `scores` (sacreBLEU's, on `test_source`) go in the card."""
    config, tokenizers = checkpoint.config, checkpoint.tokenizers
    why = refusal(config.model, tokenizers.joint)
    if why is not None:
        raise MarianError(why)
    require_new_directory(output)
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise UserError('exporting to Transformers needs safetensors: pip install "attn-cli[hf]"') from None

    size = tokenizers.target.vocab_size
    ids = exported_ids(size)
    with directory_built_whole(output) as building:
        save_file(
            marian_weights(checkpoint.model.state_dict(), config.model),
            building / "model.safetensors",
            {"format": "pt"},
        )
        _write_json(building / "config.json", marian_config(config.model, size))
        generation = {
            "decoder_start_token_id": ids.decoder_start,
            "eos_token_id": ids.eos,
            "pad_token_id": ids.pad,
            "forced_eos_token_id": ids.eos,
            "bad_words_ids": [[ids.pad]],  # the decoder start, never an output (attn rules its BOS out alike)
            "num_beams": config.decode.beam_size,
            "max_length": config.model.max_positions,
        }
        _write_json(building / "generation_config.json", generation)
        _write_json(building / "vocab.json", _marian_vocab(tokenizers))
        write_whole(building / "source.spm", tokenizers.source.model_proto)
        write_whole(building / "target.spm", tokenizers.target.model_proto)
        _write_json(
            building / "tokenizer_config.json",
            {
                "tokenizer_class": "MarianTokenizer",
                "source_lang": config.data.src_lang,
                "target_lang": config.data.tgt_lang,
                "separate_vocabs": False,
                "model_max_length": config.model.max_positions,
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
            },
        )
        write_whole(building / "README.md", model_card(checkpoint, scores, test_source))


def _marian_vocab(tokenizers: Tokenizers) -> dict[str, int]:
    target = tokenizers.target
    vocab = {}
    for marian_id, attn_id in enumerate(marian_rows(target.vocab_size)):
        piece = _MARIAN_PIECES.get(attn_id) or target.id_to_piece([attn_id])[0]
        if piece in vocab:
            raise MarianError(f"piece {piece!r} is in the vocabulary twice; Marian's vocab.json names each once")
        vocab[piece] = marian_id
    return vocab


def _write_json(path: Path, value) -> None:
    write_whole(path, json.dumps(value, ensure_ascii=False, indent=2) + "\n")


def model_card(checkpoint: Checkpoint, scores: Sequence = (), test_source: Optional[Path] = None) -> str:
    """README.md for the Hub: what the model is, its data and the data's licence, how it was
    trained, its measured scores, and how to use it."""
    config, model = checkpoint.config, checkpoint.config.model
    src, tgt = config.data.src_lang, config.data.tgt_lang
    corpus = config.data.corpus
    data_name = corpus.path or corpus.hf_name or "the corpus in its config"
    readme = corpus_readme(corpus.path) if corpus.path and corpus.path.startswith("builtin:") else None
    licence = (
        "\n".join(line for line in readme.splitlines() if line.startswith(("- Source", "- Licence", "  ")))
        if readme
        else "- Licence and attribution: those of the training data; add them here before uploading."
    )
    metrics = checkpoint.metrics
    trained = (
        f"{checkpoint.step:,} updates ({metrics.get('elapsed', 0) / 60:.0f} min), validation BLEU "
        f"{metrics['valid_bleu']:.2f}"
        if "valid_bleu" in metrics
        else f"{checkpoint.step:,} updates with attn"
        if checkpoint.step
        else "imported into attn, not trained further"
    )
    score_lines = (
        "\n".join(f"| {s.name} | {s.score:.2f} | `{s.signature}` |" for s in scores)
        if scores
        else "| (not measured: the run has no test split) | | |"
    )
    tags = config.data.target_tags  # a model of several target languages: a tag asks for each
    prefix = config.tokenizer.source_prefix or next(iter(tags.values()), None)
    example = f"{prefix} " if prefix else ""
    asking = (
        "Every source begins with the token of the language to translate into: "
        + ", ".join(f"`{tag}` ({language})" for language, tag in tags.items())
        + "."
        if tags
        else f"Every source begins with the target-language token `{prefix}`."
        if prefix
        else ""
    )
    return f"""---
language:
- {src}
- {tgt}
tags:
- translation
- marian
- attn
pipeline_tag: translation
library_name: transformers
---

# {src}→{tgt} Transformer, trained with attn

A {model.encoder_layers}+{model.decoder_layers}-layer Transformer (d_model {model.d_model},
{model.num_heads} heads, feed-forward {model.ffn_dim}, {model.activation}), translating {src} into {tgt}.
It was trained with [attn](https://pypi.org/project/attn-cli/) and exported to Transformers' Marian
architecture, which computes the same function.

## Use

```python
from transformers import MarianMTModel, MarianTokenizer

tokenizer = MarianTokenizer.from_pretrained("PATH_OR_HUB_ID")
model = MarianMTModel.from_pretrained("PATH_OR_HUB_ID")
batch = tokenizer(["{example}I love machine learning"], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

With Transformers 4, `pipeline("translation", model="PATH_OR_HUB_ID")` does the same (Transformers 5
removed that pipeline).
{asking}

## Data

- Training data: `{data_name}`.
{licence}

## Training

- {trained}.
- Config: label smoothing {config.train.label_smoothing}, dropout {model.dropout}, learning rate
  {config.train.lr} with {config.train.warmup_steps} warmup steps, SentencePiece
  {config.tokenizer.model_type} vocabulary of {config.tokenizer.vocab_size:,} pieces.

## Scores

Measured by attn on {f"`{test_source}`" if test_source else "the run's test split"} with sacreBLEU,
beam {config.decode.beam_size}:

| metric | score | signature |
|---|---|---|
{score_lines}
"""
