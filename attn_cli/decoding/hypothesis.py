"""One output of a search, and how outputs are ranked: the `Hypothesis` record and the GNMT length
penalty. Imports nothing heavy: the CTranslate2 engine and the translation pipeline use it without torch."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Hypothesis:
    """One output. With a forced prefix, `tokens` begin with the prefix's, and `log_prob`, `score`
    and `length` count only the tokens searched after it (the prefix is given, not chosen)."""

    tokens: list[int]  # output ids, without BOS and EOS
    log_prob: float  # summed log-probability of the searched tokens and the EOS that ended them
    score: float  # what ranks hypotheses: log_prob / length_penalty(length, alpha)
    length: int = 1  # the searched tokens, its EOS counted: what log_prob sums over

    @classmethod
    def scored(cls, tokens: list[int], log_prob: float, length: int, alpha: float) -> Hypothesis:
        """The hypothesis of `length` searched tokens (its EOS counted), ranked by GNMT's penalty."""
        return cls(tokens, log_prob, log_prob / length_penalty(length, alpha), length)


def length_penalty(length, alpha: float):
    """GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al., 2016); |Y| counts the EOS. alpha = 0 turns it off.
    `length` may be a number or a tensor of them."""
    return ((5 + length) / 6) ** alpha


def confidence(hypotheses: list[Hypothesis]) -> float:
    """The geometric mean of the probabilities the model gave the tokens it chose across `hypotheses`
    (the parts of one input; their EOS included, a forced prefix not): exp(log P / tokens), between 0
    and 1 and comparable across lengths. 1.0 for nothing chosen (an empty input)."""
    if not hypotheses:
        return 1.0
    return math.exp(sum(h.log_prob for h in hypotheses) / max(sum(h.length for h in hypotheses), 1))
