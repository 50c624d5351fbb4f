from pathlib import Path

import pytest
import torch

from attn_cli.model import Transformer

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"


@pytest.fixture(autouse=True)
def _single_thread_determinism():
    torch.manual_seed(0)
    yield


def small_model(**overrides) -> Transformer:
    """A random model big enough to have several heads and layers, small enough to be instant."""
    args = dict(src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4, ffn_dim=64,
                encoder_layers=2, decoder_layers=2, dropout=0.0)
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
