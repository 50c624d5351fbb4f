import os
from pathlib import Path

import pytest
import torch

from attn_cli.model import Transformer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _single_thread_determinism():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tensors this small run faster without a pool of threads,
    much faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """One tiny training run (configs/tiny.yaml, some 20 s) shared by every test file that needs one."""
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    run_dir = tmp_path_factory.mktemp("run")
    cwd = os.getcwd()
    os.chdir(REPO)  # configs/tiny.yaml: the repository's copy of the built-in config
    try:
        result = CliRunner().invoke(
            app, ["train", "--config", "configs/tiny.yaml", "--set", f"run_dir={run_dir}", "--set", "train.keep_last=1"]
        )
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return run_dir


def small_model(**overrides) -> Transformer:
    """A random model big enough to have several heads and layers, small enough to be instant."""
    args = dict(
        src_vocab_size=50,
        tgt_vocab_size=50,
        d_model=32,
        num_heads=4,
        ffn_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
    )
    args.update(overrides)
    return Transformer(**args).eval()


def random_source(batch: int, length: int, vocab: int = 50, lengths=None) -> torch.Tensor:
    """Right-padded (B, S) ids ending in EOS (3), real tokens drawn from 4..vocab-1."""
    lengths = lengths or [length] * batch
    src = torch.zeros(batch, max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        src[row, : n - 1] = torch.randint(4, vocab, (n - 1,))
        src[row, n - 1] = 3
    return src


class _LivelyTransformer(Transformer):
    """A random model whose next-token distributions vary with the position, and whose EOS grows
    likelier with length, so searches branch and sentences end at different lengths. An untrained
    model mostly repeats its input token, which would let a wrong search pass by luck."""

    def decode(self, tgt_in, encoded, cache=None, attention=None):
        start = cache.steps if cache is not None else 0
        logits = super().decode(tgt_in, encoded, cache, attention)
        return logits + self.position_bias[start : start + tgt_in.shape[1]]


def lively_model(seed: int, **overrides) -> Transformer:
    torch.manual_seed(seed)
    args = dict(
        src_vocab_size=50,
        tgt_vocab_size=50,
        d_model=32,
        num_heads=4,
        ffn_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
    )
    args.update(overrides)
    model = _LivelyTransformer(**args).eval()
    bias = 2.5 * torch.randn(64, args["tgt_vocab_size"])
    bias[:, 3] = torch.arange(64) * 0.5 - 2.0  # EOS (id 3)
    model.register_buffer("position_bias", bias, persistent=False)
    return model
