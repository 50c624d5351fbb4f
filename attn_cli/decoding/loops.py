"""Loops: a span of output written three times back to back (她就说她就说她就说, 图书馆和图书馆和图书馆和),
how they are counted in outputs, and `NoLoop`, which keeps them out of the search.

A model lost in a long input can fall into a cycle: it writes a phrase, and the phrase makes
itself likelier again. `no_stutter` (decoding/stutter.py) sees units of 1 to 4 characters, however
the tokenizer cut them; a loop is longer, and it is a cycle of the model's own tokens, so `NoLoop`
works on tokens: at each step it rules out the one token that would complete the third copy of a
span of up to `LONGEST_SPAN` tokens that writes `SHORTEST_LOOP` characters or more (哈哈哈 and
"!!!" are stutter's to judge). Spans of digits and spaces alone (1000000) are left alone, as
`no_stutter` leaves them. The search stays exact over the outputs without such a loop.

`loops` counts what a reader sees, on text: a span of at least `SHORTEST_LOOP` characters three
times back to back, whatever tokens wrote it. `token_loop` finds a loop in a finished output: the
CTranslate2 engine, whose search runs on its own, decodes such a sentence again under its nearest
rule. This module imports no torch (the rule works on the tensors the search gives it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

    from attn_cli.data.tokenizer import Tokenizer

LONGEST_SPAN = 16  # tokens: longer cycles are rare, and each span length costs a comparison per step
REPEATS = 3
SHORTEST_LOOP = 3  # characters: what `loops` counts (shorter units are stutter, decoding/stutter.py)
_LOOP = re.compile(rf"(.{{{SHORTEST_LOOP},}}?)\1{{{REPEATS - 1},}}", re.DOTALL)


def counts_as_unit(unit: str) -> bool:
    """Whether a repeated `unit` of text is a defect: digits (10000) and spaces repeat as a matter of course."""
    return not (unit.isdigit() or unit.isspace())


def loops(text: str) -> bool:
    """Whether a span of `SHORTEST_LOOP` or more characters, not digits or spaces alone, comes
    three times back to back in `text`."""
    return any(counts_as_unit(match.group(1)) for match in _LOOP.finditer(text))


@dataclass(frozen=True)
class LoopVocabulary:
    """What the rule needs of each target id: whether a span of such tokens alone may repeat (its
    text is digits or spaces), and how many characters it writes (a byte piece counts as one)."""

    repeatable: tuple[bool, ...]
    characters: tuple[int, ...]

    @classmethod
    def of(cls, piece_texts: Sequence[Optional[str]]) -> "LoopVocabulary":
        return cls(
            tuple(bool(text) and not counts_as_unit(text) for text in piece_texts),
            tuple(len(text) if text else 1 for text in piece_texts),
        )


class NoLoop:
    """The rule over one target vocabulary."""

    rule = "decode.no_loops"  # how a message names it

    def __init__(self, piece_texts: Sequence[Optional[str]]):
        self.vocabulary = LoopVocabulary.of(piece_texts)
        self._tables: dict = {}  # per device: (repeatable, characters) as tensors

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> "NoLoop":
        return cls(tokenizer.piece_texts())

    def restrict(self, log_probs: torch.Tensor, history: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
        """Rule out, in place, each row's token that would complete a span's third copy. `history`
        (rows, L) is each row's BOS, prefix and searched tokens; `steps_left` is not needed here."""
        tokens = history[:, 1:]  # without BOS
        length = tokens.shape[1]
        if tokens.device not in self._tables:
            self._tables[tokens.device] = (
                tokens.new_tensor(self.vocabulary.repeatable).bool(),
                tokens.new_tensor(self.vocabulary.characters),
            )
        repeatable, characters = self._tables[tokens.device]
        for span in range(1, min(LONGEST_SPAN, (length + 1) // REPEATS) + 1):
            # The next token t completes three copies of a span of `span` tokens when the last
            # 3 * span - 1 tokens and t repeat with period `span`: t must equal tokens[-span], and
            # each of the last 2 * span - 1 tokens the one `span` before it.
            recent = tokens[:, length - (2 * span - 1) :]  # (rows, 2 * span - 1)
            earlier = tokens[:, length - (3 * span - 1) : length - span]  # the same shifted by one span
            unit = tokens[:, length - span :]  # (rows, span): the span that would repeat
            looping = (
                (recent == earlier).all(dim=1)
                & ~repeatable[unit].all(dim=1)
                & (characters[unit].sum(dim=1) >= SHORTEST_LOOP)
            )
            rows = looping.nonzero().squeeze(1)
            if rows.numel():
                log_probs[rows, tokens[rows, length - span]] = float("-inf")
        return log_probs


def token_loop(tokens: Sequence[int], vocabulary: LoopVocabulary) -> bool:
    """Whether a span of 1 to `LONGEST_SPAN` tokens, of `SHORTEST_LOOP` characters or more and not
    all repeatable, comes three times back to back anywhere in `tokens`: what `NoLoop` keeps out of
    a search."""
    tokens = list(tokens)
    for end in range(REPEATS, len(tokens) + 1):
        for span in range(1, min(LONGEST_SPAN, end // REPEATS) + 1):
            unit = tokens[end - span : end]
            if (
                tokens[end - REPEATS * span : end] == unit * REPEATS
                and not all(vocabulary.repeatable[t] for t in unit)
                and sum(vocabulary.characters[t] for t in unit) >= SHORTEST_LOOP
            ):
                return True
    return False
