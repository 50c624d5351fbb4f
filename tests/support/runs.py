"""Configs, tiny training runs, instant tokenizers and random checkpoints for the tests."""

import dataclasses
from pathlib import Path

import pytest

from support.models import small_model

REPO = Path(__file__).resolve().parents[2]


def tiny_config(*settings: str, run_dir=None):
    """configs/tiny.yaml (the repository's copy of the built-in config) loaded with `settings`
    (key=value), and with run_dir when one is given."""
    from attn_cli.config import load_config

    return load_config(REPO / "configs" / "tiny.yaml", [*([f"run_dir={run_dir}"] if run_dir else []), *settings])


def train_tiny(run_dir, *settings: str, resume: bool = False):
    """`attn train --config configs/tiny.yaml --set run_dir=...` with a --set for each of `settings`
    (and --resume), run from the repository; returns the CliRunner result."""
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    args = ["train", "--config", "configs/tiny.yaml", "--set", f"run_dir={run_dir}"]
    for setting in settings:
        args += ["--set", setting]
    if resume:
        args.append("--resume")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # configs/tiny.yaml: the repository's copy of the built-in config
        return CliRunner().invoke(app, args)


def numbered_tokenizers():
    """Joint tokenizers of 300 pieces trained on 200 numbered English and Chinese sentences: instant."""
    from attn_cli.config import TokenizerConfig
    from attn_cli.data.tokenizer import train_tokenizers

    return train_tokenizers(
        [f"sentence number {i}" for i in range(200)],
        [f"句子{i}号" for i in range(200)],
        TokenizerConfig(vocab_size=300, character_coverage=1.0),
    )


def checkpoint_parts():
    """What save_checkpoint takes: a config of a one-layer model (its corpus never read),
    numbered_tokenizers() and a random small_model of that config's sizes."""
    from attn_cli.config import Config, CorpusConfig, DataConfig, ModelConfig

    cfg = Config(
        data=DataConfig(corpus=CorpusConfig(path="corpus.tsv")),
        model=ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=1),
    )
    tokenizers = numbered_tokenizers()
    vocab = tokenizers.source.vocab_size
    return cfg, tokenizers, small_model(src_vocab_size=vocab, tgt_vocab_size=vocab, encoder_layers=1, decoder_layers=1)


def hello_tokenizers(vocab_size: int = 273, byte_fallback: bool = True):
    """Tokenizers trained on "hello world" and 你好世界 alone: with byte fallback, 273 pieces are the
    4 special ones, the 256 byte pieces and a few more."""
    from attn_cli.config import TokenizerConfig
    from attn_cli.data.tokenizer import train_tokenizers

    return train_tokenizers(
        ["hello world"] * 20,
        ["你好世界"] * 20,
        TokenizerConfig(vocab_size=vocab_size, character_coverage=1.0, byte_fallback=byte_fallback),
    )


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


def one_way(held_out: dict) -> list:
    """The held-out pairs of a model of one direction (validation or test pairs by direction)."""
    assert len(held_out) <= 1, f"pairs held out in {len(held_out)} directions"
    return next(iter(held_out.values()), [])
