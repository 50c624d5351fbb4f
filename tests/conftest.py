import dataclasses
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
    """One tiny training run (configs/tiny.yaml, some 20 s) shared by every test file that needs one.
    A test that changes the run directory copies it first: `shutil.copytree(trained_run, tmp_path / "run")`."""
    run_dir = tmp_path_factory.mktemp("run")
    result = train_tiny(run_dir, "train.keep_last=1")
    assert result.exit_code == 0, result.output
    return run_dir


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


SMALL_MODEL = dict(
    src_vocab_size=50,
    tgt_vocab_size=50,
    d_model=32,
    num_heads=4,
    ffn_dim=64,
    encoder_layers=2,
    decoder_layers=2,
    dropout=0.0,
)


def small_model(**overrides) -> Transformer:
    """A random model big enough to have several heads and layers, small enough to be instant."""
    return Transformer(**{**SMALL_MODEL, **overrides}).eval()


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
    args = {**SMALL_MODEL, **overrides}
    model = _LivelyTransformer(**args).eval()
    bias = 2.5 * torch.randn(64, args["tgt_vocab_size"])
    bias[:, 3] = torch.arange(64) * 0.5 - 2.0  # EOS (id 3)
    model.register_buffer("position_bias", bias, persistent=False)
    return model


def unpadded(src: torch.Tensor, row: int) -> torch.Tensor:
    """Row `row` of right-padded ids without its padding (id 0)."""
    return src[row][src[row] != 0]


def parameters_of(model) -> dict[str, torch.Tensor]:
    """A copy of the model's state, to compare with after an update."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def random_examples(count: int, seed: int = 0, *, lengths=(2, 8), target_offsets=(1, 1), vocab: int = 50):
    """`count` examples of random tokens 4..vocab-1, each source `lengths` (least, most) long and its
    target that length plus one of `target_offsets` (least, most), at least 1. A range of one value
    draws nothing, so the stream of random numbers is the same with and without it."""
    from attn_cli.data.batching import Example

    generator = torch.Generator().manual_seed(seed)

    def drawn(low: int, high: int) -> int:
        return low if low == high else int(torch.randint(low, high + 1, (1,), generator=generator))

    examples = []
    for index in range(count):
        length = drawn(*lengths)
        target_length = max(1, length + drawn(*target_offsets))
        examples.append(
            Example(
                index,
                torch.randint(4, vocab, (length,), generator=generator).tolist(),
                torch.randint(4, vocab, (target_length,), generator=generator).tolist(),
            )
        )
    return examples


def reversal_batch(generator: torch.Generator, *, batch: int = 32, lengths=(6, 6), vocab: int = 12):
    """A collated batch of sources of random tokens 4..vocab-1, `lengths` (least, most) long before
    EOS, whose targets are the sources reversed. A range of one value draws no lengths."""
    from attn_cli.data.batching import Example, collate

    examples = []
    for index in range(batch):
        low, high = lengths
        length = low if low == high else int(torch.randint(low, high + 1, (1,), generator=generator))
        tokens = torch.randint(4, vocab, (length,), generator=generator).tolist()
        examples.append(Example(index, tokens, tokens[::-1]))
    return collate(examples)


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


@pytest.fixture(scope="session")
def served_checkpoint(tmp_path_factory):
    """save_random_checkpoint's checkpoint, shared by the attn serve tests (none of them writes to it)."""
    return save_random_checkpoint(tmp_path_factory.mktemp("served") / "model.pt")
