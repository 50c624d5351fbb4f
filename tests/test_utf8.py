"""Outputs are always valid UTF-8: byte pieces are kept to well-formed sequences during the search."""

import pytest
import torch
from support.models import random_source
from support.runs import hello_tokenizers

from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings
from attn_cli.decoding.utf8 import Utf8Constraint
from attn_cli.model import Transformer
from attn_cli.vocab import BOS_ID, EOS_ID

# A vocabulary of 4 special ids, the 256 byte pieces (id 4 + byte) and 10 text pieces ("a" to "j").
BYTE = 4
TEXT = 260
VOCAB = 270
CONSTRAINT = Utf8Constraint(torch.tensor([-1] * 4 + list(range(256)) + [-1] * 10))


def allowed(history: list[int], steps_left: int = 10) -> set[int]:
    log_probs = CONSTRAINT.restrict(
        torch.zeros(1, VOCAB), torch.tensor([[BOS_ID, *history]]), torch.tensor([steps_left])
    )
    return set((~torch.isinf(log_probs[0])).nonzero().flatten().tolist())


def byte_ids(low: int, high: int) -> set[int]:
    return {BYTE + value for value in range(low, high + 1)}


def test_each_state_allows_what_utf8_allows_next():
    text = set(range(TEXT, VOCAB))
    starts = byte_ids(0x00, 0x7F) | byte_ids(0xC2, 0xF4)
    assert allowed([]) == {0, 1, 2, EOS_ID} | text | starts  # specials are the search's to rule out
    assert allowed([TEXT]) == allowed([]) == allowed([BYTE + 0x41])  # after text or an ASCII byte
    assert allowed([BYTE + 0xE4]) == byte_ids(0x80, 0xBF)  # inside 中 (E4 B8 AD): no EOS, no text
    assert allowed([BYTE + 0xE4, BYTE + 0xB8]) == byte_ids(0x80, 0xBF)
    assert allowed([BYTE + 0xE4, BYTE + 0xB8, BYTE + 0xAD]) == allowed([])
    for lead, low, high in (
        (0xE0, 0xA0, 0xBF),
        (0xED, 0x80, 0x9F),
        (0xF0, 0x90, 0xBF),
        (0xF4, 0x80, 0x8F),
        (0xC3, 0x80, 0xBF),
    ):
        assert allowed([TEXT, BYTE + lead]) == byte_ids(low, high), hex(lead)
    assert allowed([BYTE + 0xF0, BYTE + 0x9F, BYTE + 0x98]) == byte_ids(0x80, 0xBF)  # the last byte of 😀
    # A character must end before the limit: with 2 tokens left, only 2-byte leads may start one.
    assert allowed([], steps_left=2) == allowed([]) - byte_ids(0xE0, 0xF4)
    assert allowed([], steps_left=1) == allowed([]) - byte_ids(0xC2, 0xF4)


class ByteLoving(Transformer):
    """A random model pushed towards bytes 0x80-0xFF: left alone it writes broken UTF-8."""

    def decode(self, tgt_in, encoded, cache=None, attention=None):
        return super().decode(tgt_in, encoded, cache, attention) + self.preference


def byte_loving_model(seed: int) -> ByteLoving:
    torch.manual_seed(seed)
    model = ByteLoving(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        d_model=32,
        num_heads=4,
        ffn_dim=64,
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.0,
    ).eval()
    preference = torch.randn(VOCAB)
    preference[BYTE + 0x80 : BYTE + 0x100] += 4.0
    model.register_buffer("preference", preference, persistent=False)
    return model


def as_bytes(tokens: list[int]) -> bytes:
    return b"".join(bytes([t - BYTE]) if BYTE <= t < TEXT else b"a" for t in tokens)


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("beam", [1, 3])
def test_a_model_drawn_to_bytes_writes_valid_utf8_only_under_the_constraint(beam):
    broken = 0
    for seed in range(3):
        model = byte_loving_model(seed)
        src = random_source(6, 8, vocab=VOCAB, lengths=[8, 3, 5, 7, 6, 4])
        search = (
            (lambda **kw: greedy_search(model, src, SearchSettings(max_len_a=1.0, max_len_b=6, **kw)))
            if beam == 1
            else (
                lambda **kw: beam_search(
                    model, src, SearchSettings(beam, length_penalty=0.6, max_len_a=1.0, max_len_b=6, **kw)
                )
            )
        )
        free, valid = search(), search(constraints=(CONSTRAINT,))
        for unconstrained, constrained in zip(free, valid):
            assert is_utf8(as_bytes(constrained[0].tokens)), constrained[0].tokens
            if not is_utf8(as_bytes(unconstrained[0].tokens)):
                broken += 1
            elif beam == 1:  # greedy that never had to be steered is unchanged
                assert constrained[0].tokens == unconstrained[0].tokens
    assert broken, "left alone the model writes broken UTF-8, so the constraint was tried"


def test_the_tokenizer_s_byte_pieces_are_found(tmp_path):
    tokenizers = hello_tokenizers()
    constraint = Utf8Constraint.for_tokenizer(tokenizers.target)
    assert constraint is not None
    assert (constraint.byte_of_piece >= 0).sum() == 256
    assert constraint.byte_of_piece[tokenizers.target.piece_to_id("<0xE4>")] == 0xE4
    without = hello_tokenizers(vocab_size=16, byte_fallback=False)
    assert Utf8Constraint.for_tokenizer(without.target) is None
