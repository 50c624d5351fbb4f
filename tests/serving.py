"""What the serving tests share: a small random model saved as a checkpoint (random weights give
non-empty, varied outputs), and an in-process server of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from conftest import checkpoint_parts, small_model

SENTENCES = ["sentence number 3", "sentence number 17", "number 5", "sentence sentence 42 number"]


def save_random_checkpoint(path: Path) -> Path:
    """An en-zh checkpoint of a random two-layer model with learned positions (so that a prefix can
    be longer than the model outputs) and numbered_tokenizers()."""
    from attn_cli.checkpoint import save_checkpoint
    from attn_cli.config import ModelConfig

    cfg, tokenizers, _ = checkpoint_parts()
    sizes = dict(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=2, decoder_layers=2)
    shape = dict(positions="learned", max_positions=160)
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, src_lang="en", tgt_lang="zh"),
        model=ModelConfig(**sizes, **shape),
    )
    vocab = tokenizers.source.vocab_size
    model = small_model(src_vocab_size=vocab, tgt_vocab_size=vocab, **sizes, **shape)
    save_checkpoint(path, cfg, tokenizers, model, step=1, epoch=1)
    return path


def server_of(checkpoint: Path, **limits):
    """A Server of the checkpoint (its workers not started: the app's lifespan or the test starts them)."""
    from attn_cli.serving.models import ServedModels
    from attn_cli.serving.server import Limits, Server
    from attn_cli.translator import load_for_decoding

    api_keys = limits.pop("api_keys", None)
    return Server(ServedModels([load_for_decoding([], [checkpoint], None, "cpu")]), Limits(**limits), api_keys)


def reference(server, sentences, **options):
    """What attn translate gives for `sentences` with the served model and these decoding options."""
    from attn_cli.decoding.options import override_decode
    from attn_cli.translator import translate

    loaded = next(iter(server.models)).loaded
    return translate(loaded, sentences, override_decode(loaded.config.decode, options))
