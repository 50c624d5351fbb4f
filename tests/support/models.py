"""Small random models and sources for the tests: instant to build, lively enough that a wrong search
cannot pass by luck."""

import torch

from attn_cli.model import Transformer

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
    from attn_cli.data.batching import Example
    from attn_cli.data.collate import collate

    examples = []
    for index in range(batch):
        low, high = lengths
        length = low if low == high else int(torch.randint(low, high + 1, (1,), generator=generator))
        tokens = torch.randint(4, vocab, (length,), generator=generator).tolist()
        examples.append(Example(index, tokens, tokens[::-1]))
    return collate(examples)
