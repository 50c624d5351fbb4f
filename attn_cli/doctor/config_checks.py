"""The config checks: the heads and their size, learned positions against the data's lengths, and
the vocabulary against the training text."""

from __future__ import annotations

from typing import Optional

import numpy as np

from attn_cli.config import Config, ConfigError
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.doctor.checks import Check
from attn_cli.doctor.data_checks import TokenCounts
from attn_cli.vocab import EOS_ID

SECTION = "config"
# "d_k = d_v = d_model/h = 64" (Vaswani et al.): far smaller heads each see too few dimensions to
# tell keys apart, far larger ones leave too few heads to attend to several things at once.
HEAD_SIZE_RANGE = (32, 128)
# A piece seen fewer times than this in training keeps an embedding little moved from its random
# start; when a fifth of the vocabulary is that rare, a smaller vocabulary spends the same
# parameters on pieces the model can learn (cf. Gowda & May, 2020, "Finding the optimal vocabulary
# size for neural machine translation", who ask most pieces to occur 100 times; this bar is lower,
# so that small corpora such as the default's pass with a vocabulary that works for them).
RARE_PIECE_OCCURRENCES = 5
RARE_PIECES_TOLERATED = 0.2
SMALLEST_VOCABULARY = 300  # what tokenizer.vocab_size takes: byte fallback alone needs 260 pieces


def invalid_config_check(error: ConfigError) -> Check:
    """A config that does not load: the one check there is to report on it."""
    name = "heads divide d_model" if error.key == "model.num_heads" else "config valid"
    return Check(SECTION, name, "fail", str(error), f"change {error.key}" if error.key else "fix the config file")


def config_checks(cfg: Config, tokens: Optional[TokenCounts], tokenizers: Optional[Tokenizers]) -> list[Check]:
    return [_heads_divide(cfg), _head_size(cfg), _positions(cfg, tokens), _vocabulary(cfg, tokens, tokenizers)]


def _heads_divide(cfg: Config) -> Check:
    model = cfg.model
    return Check(
        SECTION,
        "heads divide d_model",
        "pass",
        f"{model.num_heads} heads x {model.d_model // model.num_heads} = model.d_model {model.d_model}",
        "set model.num_heads to a divisor of model.d_model",
    )


def _head_size(cfg: Config) -> Check:
    model = cfg.model
    size = model.d_model // model.num_heads
    low, high = HEAD_SIZE_RANGE
    found = f"d_head = {model.d_model} / {model.num_heads} = {size}"
    numbers = {"d_head": size}
    if low <= size <= high:
        return Check(SECTION, "head size", "pass", found + f" (within {low}-{high}; the paper's 64)", numbers=numbers)
    heads = max(1, model.d_model // 64)
    side = "below" if size < low else "above"
    return Check(
        SECTION,
        "head size",
        "warn",
        f"{found}, {side} {low}-{high}: each head "
        + (
            "sees too few dimensions to tell keys apart"
            if size < low
            else "is one of too few to attend to several things"
        ),
        f"set model.num_heads: {heads} (d_head {model.d_model // heads})",
        numbers,
    )


def _positions(cfg: Config, tokens: Optional[TokenCounts]) -> Check:
    model = cfg.model
    if model.positions != "learned":
        return Check(SECTION, "max positions", "pass", f"model.positions: {model.positions} extends to any length")
    if tokens is None:
        return Check(
            SECTION,
            "max positions",
            "skip",
            "learned positions, but no tokenizer yet to measure the data in tokens",
            "run `attn prepare` with this config first",
        )
    # A source gets EOS and a decoder input BOS: one position more than its tokens.
    trained = max(cfg.longest_training_sides())
    if cfg.train.join.rate == 0:  # joined pairs (train.join) reach about their limit, beyond the corpus's longest pair
        trained = min(trained, max(tokens.longest_source, tokens.longest_target))
    trained += 1
    numbers = {
        "max_positions": model.max_positions,
        "longest_trained": trained,
        "over_length_limits": tokens.over_length_limits,
    }
    found = (
        f"model.max_positions {model.max_positions}; the longest training pair needs {trained} "
        f"({tokens.origin}); {tokens.over_length_limits:,} pairs exceed data.max_*_tokens"
    )
    if model.max_positions > trained:
        return Check(
            SECTION,
            "max positions",
            "warn",
            found + f": positions {trained}-{model.max_positions - 1} are "
            "never trained, and longer inputs meet their random embeddings",
            f"set model.max_positions: {trained} (longer inputs are then split: decode.long_inputs)",
            numbers,
        )
    return Check(SECTION, "max positions", "pass", found, numbers=numbers)


def _vocabulary(cfg: Config, tokens: Optional[TokenCounts], tokenizers: Optional[Tokenizers]) -> Check:
    if tokens is None or tokenizers is None:
        return Check(
            SECTION,
            "vocabulary size",
            "skip",
            "no tokenizer yet to count the pieces of the training text",
            "run `attn prepare` with this config first",
        )
    found, numbers, suggestions = [], {}, []
    for name, counts in tokens.counts.items():
        tokenizer = tokenizers.target if name == "target" else tokenizers.source
        learnable = _learnable_pieces(tokenizer)
        occurrences = counts[learnable]
        rare = float(np.mean(occurrences < RARE_PIECE_OCCURRENCES)) if len(occurrences) else 0.0
        per_piece = counts.sum() / tokenizer.vocab_size
        label = "" if name == "joint" else f"{name}: "
        found.append(
            f"{label}{tokenizer.vocab_size:,} pieces, {int(counts.sum()):,} training tokens ({per_piece:,.0f} per "
            f"piece); {rare:.0%} of pieces occur fewer than {RARE_PIECE_OCCURRENCES} times"
        )
        numbers[name] = {"vocab_size": tokenizer.vocab_size, "tokens": int(counts.sum()), "rare_share": round(rare, 4)}
        if rare > RARE_PIECES_TOLERATED:
            frequent = int((occurrences >= RARE_PIECE_OCCURRENCES).sum()) + tokenizer.vocab_size - len(occurrences)
            suggestions.append(max(SMALLEST_VOCABULARY, frequent // 100 * 100))
    text = "; ".join(found) + f" (in {tokens.origin})"
    if suggestions:
        return Check(
            SECTION,
            "vocabulary size",
            "warn",
            text + ": too many pieces to learn from this much text",
            f"set tokenizer.vocab_size: {min(suggestions):,} in a new run_dir",
            numbers,
        )
    return Check(SECTION, "vocabulary size", "pass", text, numbers=numbers)


def _learnable_pieces(tokenizer) -> np.ndarray:
    """The ids of the pieces the text is made of: not the special ids, nor byte fallback's 256
    pieces, which exist for characters the training text did not have and are rare by design."""
    pieces = tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))
    return np.array(
        [
            index
            for index, piece in enumerate(pieces)
            if index > EOS_ID and not (piece.startswith("<0x") and piece.endswith(">"))
        ],
        dtype=np.int64,
    )
