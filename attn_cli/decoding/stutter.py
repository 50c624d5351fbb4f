"""Stutter: a unit of 1 to 4 characters three times in a row (叔叔叔叔, 一座一座一座), how it is
counted in outputs, and `NoStutter`, which keeps it out of them during the search.

A model that loses its place in a long input may write the same character or word again and again.
`no_repeat_ngram` works on tokens, and cannot see a repeat the tokenizer cut differently each time
(过 · 过 · 过去 writes 过过过去, and no token bigram in it comes twice). `NoStutter` works on the
text: at each step it rules out every token whose text would complete a unit repeated three times.
Digits (10000) and whitespace repeat as a matter of course and are left alone. The search stays
exact over the outputs without stutter: it only removes the others.

A token's text is its piece with ▁ as a space. Byte pieces, and the special pieces, carry no text
here: a character written in bytes ends the run before it (its own repeats are not seen).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import torch

from attn_cli.data.tokenizer import Tokenizer
from attn_cli.decoding.loops import counts_as_unit

LONGEST_UNIT = 4
REPEATS = 3
_LONGEST_STUTTER = LONGEST_UNIT * REPEATS
_STUTTER = re.compile(rf"(.{{1,{LONGEST_UNIT}}}?)\1{{{REPEATS - 1},}}", re.DOTALL)


def stutters(text: str) -> bool:
    """Whether a unit of 1 to 4 characters repeats three times or more in a row (what
    `attn eval --by-length` counts)."""
    return any(counts_as_unit(match.group(1)) for match in _STUTTER.finditer(text))


def has_new_stutter(text: str, old_length: int) -> bool:
    """Whether `text` holds a stutter that ends after its first `old_length` characters: one that
    appending `text[old_length:]` completed. The plain definition `NoStutter` is tested against."""
    for end in range(old_length + 1, len(text) + 1):
        for unit_length in range(1, LONGEST_UNIT + 1):
            start = end - REPEATS * unit_length
            unit = text[start : start + unit_length]
            if start >= 0 and counts_as_unit(unit) and text[start:end] == unit * REPEATS:
                return True
    return False


class NoStutter:
    """The texts of one target vocabulary, indexed so that the tokens completing a stutter are found
    from a row's last characters alone."""

    rule = "decode.no_stutter"  # how a message names it

    def __init__(self, piece_texts: Sequence[Optional[str]]):
        self.texts = list(piece_texts)  # per id: what the piece adds to the output, None for no text
        # Tokens whose own text stutters: never allowed.
        self.stuttering = torch.tensor(
            [i for i, text in enumerate(self.texts) if text and has_new_stutter(text, 0)], dtype=torch.long
        )
        # The tokens whose text starts with each string of up to 2 * LONGEST_UNIT characters, the most
        # a stutter begun in the output can still need.
        self.starting_with: dict[str, list[int]] = {}
        # The tokens that complete a stutter begun by the output's last j < unit length characters:
        # the text must start with the rest of the unit, then the unit twice. Keyed by those j characters.
        self.completing: dict[str, list[int]] = {}
        for token, text in enumerate(self.texts):
            if not text:
                continue
            for length in range(1, min(len(text), 2 * LONGEST_UNIT) + 1):
                self.starting_with.setdefault(text[:length], []).append(token)
            for unit_length in range(2, LONGEST_UNIT + 1):
                for begun in range(1, unit_length):  # characters of the first unit already in the output
                    rest = text[: unit_length - begun]
                    ending = text[unit_length - begun : unit_length]  # what the output must end with
                    unit = ending + rest
                    if counts_as_unit(unit) and text.startswith((unit * REPEATS)[begun:]):
                        self.completing.setdefault(ending, []).append(token)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> "NoStutter":
        return cls(tokenizer.piece_texts())

    def restrict(self, log_probs: torch.Tensor, history: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
        """Rule out, in place, each row's tokens that would complete a stutter. `history` (rows, L)
        is each row's BOS, prefix and searched tokens; `steps_left` is not needed here."""
        device = log_probs.device
        if self.stuttering.numel():
            log_probs[:, self.stuttering.to(device)] = float("-inf")
        # A stutter spans at most 12 characters and every token with text has one or more: the last
        # 11 tokens hold all of the output a new stutter can begin in.
        rows, columns = [], []
        for row, tail in enumerate(history[:, -(_LONGEST_STUTTER - 1) :].tolist()):
            banned = self._banned_after(self._last_characters(tail))
            rows.extend([row] * len(banned))
            columns.extend(banned)
        if columns:
            log_probs[torch.tensor(rows, device=device), torch.tensor(columns, device=device)] = float("-inf")
        return log_probs

    def _last_characters(self, tokens: list[int]) -> str:
        """The text of the output's last tokens, up to 11 characters, back to the first token without text."""
        parts, length = [], 0
        for token in reversed(tokens):
            text = self.texts[token]
            if not text:
                break
            parts.append(text)
            length += len(text)
            if length >= _LONGEST_STUTTER - 1:
                break
        return "".join(reversed(parts))[-(_LONGEST_STUTTER - 1) :]

    def _banned_after(self, tail: str) -> list[int]:
        """The tokens that would complete a stutter after an output ending in `tail`."""
        banned: list[int] = []
        for begun in range(1, min(len(tail), LONGEST_UNIT - 1) + 1):  # less than a unit already out
            banned.extend(self.completing.get(tail[-begun:], ()))
        for unit_length in range(1, min(len(tail), LONGEST_UNIT) + 1):
            # How many of the last characters repeat the one unit_length before them: a stutter with
            # this unit has begun in the output's last unit_length + `repeating` characters at most.
            repeating = 0
            while (
                repeating < (REPEATS - 1) * unit_length - 1
                and repeating + unit_length < len(tail)
                and tail[-1 - repeating] == tail[-1 - repeating - unit_length]
            ):
                repeating += 1
            for begun in range(unit_length, unit_length + repeating + 1):  # a whole unit out fixes the rest
                unit = tail[len(tail) - begun : len(tail) - begun + unit_length]
                if counts_as_unit(unit):
                    banned.extend(self.starting_with.get((unit * REPEATS)[begun:], ()))
        return banned
