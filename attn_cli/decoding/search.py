"""What every search shares: its settings (`SearchSettings`), output length bounds, the empty forced
prefix, the next-token distribution and the rules that restrict it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

import torch

from attn_cli.decoding.engine import SearchStopped, StopCheck
from attn_cli.decoding.loops import NoLoop
from attn_cli.decoding.stutter import NoStutter
from attn_cli.decoding.utf8 import Utf8Constraint
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    from attn_cli.config import DecodeConfig
    from attn_cli.data.lengths import LengthModel
    from attn_cli.data.tokenizer import Tokenizer

# Tokens the decoder must never emit: padding and a second start-of-sentence.
_NEVER_EMITTED = [PAD_ID, BOS_ID]


class OutputConstraint(Protocol):
    """A rule every output keeps, applied at each step of a search (decoding/utf8.py, decoding/stutter.py)."""

    rule: str  # how a message names it, e.g. "decode.no_stutter"

    def restrict(self, log_probs: torch.Tensor, history: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
        """Rule out, in place, each row's next tokens that would break the rule. `history` (rows, L)
        is each row's BOS, prefix and searched tokens; `steps_left` (rows,) how many tokens each row
        may still add before its EOS, this one included."""
        ...


@dataclass(frozen=True)
class SearchSettings:
    """What one search is asked for: how many hypotheses it keeps and returns, how they are ranked,
    how long an output may be, and the rules every output keeps. Greedy search and sampling keep one
    hypothesis (`beam_size` is the beam search's) and return `n_best` outputs per source."""

    beam_size: int = 1
    n_best: int = 1  # outputs per source, best first; with sampling, the samples drawn
    length_penalty: float = 0.0  # GNMT's exponent alpha; 0 ranks by log-probability alone
    max_len_a: float = 1.5  # an output may have a * source length + b tokens
    max_len_b: int = 10
    no_repeat_ngram: int = 0  # > 0: no token n-gram of this size twice in an output
    constraints: tuple[OutputConstraint, ...] = ()  # rules applied at every step (valid UTF-8, no stutter)
    exact_steps: Optional[int] = None  # benchmarks: force this many tokens after the prefix, EOS and rules off
    lengths: Optional[LengthModel] = None  # the training pairs' lengths: each output's plausible bounds
    stop: Optional[StopCheck] = None  # asked before each step: True ends the search with SearchStopped

    def check_stop(self) -> None:
        if self.stop is not None and self.stop():
            raise SearchStopped("the search was asked to stop")

    @property
    def restricts(self) -> bool:
        """Whether a step rules out tokens beyond the limits: the rules, no_repeat_ngram or a floor."""
        return bool(self.no_repeat_ngram or self.rules or (self.lengths is not None and self.exact_steps is None))

    @classmethod
    def of(
        cls,
        options: DecodeConfig,
        constraints: Sequence[OutputConstraint] = (),
        lengths: Optional[LengthModel] = None,
    ) -> SearchSettings:
        """The settings a config's `decode` section (or a command's options) asks for, over a model
        whose training pairs' `lengths` are known (None: not known), which `decode.learned_lengths` uses."""
        shared = ("beam_size", "n_best", "length_penalty", "max_len_a", "max_len_b", "no_repeat_ngram")
        return cls(
            **{name: getattr(options, name) for name in shared},
            constraints=tuple(constraints),
            lengths=lengths if options.learned_lengths else None,
        )

    @property
    def rules(self) -> tuple[OutputConstraint, ...]:
        """The constraints a step applies: none when decoding to a forced length."""
        return self.constraints if self.exact_steps is None else ()


def output_bounds(
    max_target_tokens: Optional[int], src: torch.Tensor, settings: SearchSettings, prefix_length: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sentence (floors, limits): how many tokens each output must and may have, counted without
    BOS and EOS and after a forced prefix of `prefix_length` tokens.

    The limit is a * source_length + b, lowered to the longest output the training pairs make
    plausible for the source's length when `settings.lengths` holds them, and capped where learned
    target positions end (`max_target_tokens`, None for no end; one position is kept for the EOS).
    The floor is the shortest plausible output (0 without `settings.lengths`). A prefix is part of
    the output, so it counts toward both (a limit of 0: the output is the prefix and an EOS)."""
    source_lengths = (src != PAD_ID).sum(dim=1) - 1  # the source ends in EOS
    limits = (settings.max_len_a * source_lengths.float()).long() + settings.max_len_b
    floors = torch.zeros_like(limits)
    if settings.lengths is not None and settings.exact_steps is None:
        shortest, longest = settings.lengths.bounds(source_lengths.cpu().numpy())
        limits = limits.minimum(torch.from_numpy(longest).to(limits.device))
        floors = torch.from_numpy(shortest).to(limits.device)
    if max_target_tokens is not None:
        limits = limits.clamp(max=max_target_tokens)
    limits = (limits - prefix_length).clamp(min=0)
    return (floors - prefix_length).clamp(min=0).minimum(limits), limits


def prefix_and_bounds(
    src: torch.Tensor, prefix: Optional[torch.Tensor], max_target_tokens: Optional[int], settings: SearchSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where a search over (B, S) sources starts: the forced prefix of every row ((B, 0) for none),
    and how many tokens each row must and may search after it (`output_bounds`)."""
    prefix = no_prefix(src) if prefix is None else prefix
    return (prefix, *output_bounds(max_target_tokens, src, settings, prefix.shape[1]))


def no_prefix(src: torch.Tensor) -> torch.Tensor:
    """The empty forced prefix of every row of `src`: (B, 0)."""
    return src.new_empty((src.shape[0], 0))


def next_token_log_probs(
    logits: torch.Tensor, at_limit: Optional[torch.Tensor], exact: bool, normalize: bool = True
) -> torch.Tensor:
    """(rows, V) logits -> log-probabilities of what may come next.

    Padding and BOS are never emitted. A row whose `at_limit` is True may only end (EOS keeps its
    own probability, so scores stay true log-probabilities); None means no row is at its limit.
    `exact` forbids ending at all. `normalize=False` leaves the log-softmax out: the same ranking,
    for a caller that needs only the most likely token and no score.
    """
    logits = logits.float()
    logits[:, _NEVER_EMITTED] = float("-inf")
    log_probs = logits.log_softmax(dim=-1) if normalize else logits
    if exact:
        log_probs[:, EOS_ID] = float("-inf")
    elif at_limit is not None and at_limit.any():
        eos = log_probs[at_limit, EOS_ID]
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, EOS_ID] = eos
    return log_probs


def ban_repeated_ngrams(log_probs: torch.Tensor, history: torch.Tensor, n: int) -> torch.Tensor:
    """Forbid, in place, each row's next tokens that would complete a token n-gram the row already
    holds (fairseq's and CTranslate2's no_repeat_ngram_size), so a stutter such as 叔叔叔叔 cannot
    grow; `n` = 1 forbids every token already used. `history` (rows, L) is BOS, any forced prefix
    and the tokens searched so far; EOS is never in it, so every row may still end."""
    tokens = history[:, 1:]  # without BOS
    length = tokens.shape[1]
    if n < 1 or length < n:  # no complete n-gram yet
        return log_probs
    windows = tokens.unfold(1, n, 1)  # (rows, L - n + 1, n): every n-gram so far
    ending = tokens[:, length - n + 1 :]  # (rows, n - 1): what the next token would complete
    repeats = (windows[:, :, :-1] == ending[:, None, :]).all(dim=-1)  # (rows, L - n + 1)
    rows, starts = repeats.nonzero(as_tuple=True)
    log_probs[rows, windows[rows, starts, -1]] = float("-inf")
    return log_probs


def restrict_next_tokens(
    log_probs: torch.Tensor,
    history: torch.Tensor,
    steps_left: torch.Tensor,
    no_repeat_ngram: int = 0,
    constraints: Sequence[OutputConstraint] = (),
    too_short: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Rule out, in place, the next tokens that `no_repeat_ngram` and each of `constraints` forbid
    (`steps_left` as `OutputConstraint.restrict` takes it), and the end of each row that `too_short`
    (rows,) marks: one below its floor.

    The rules together can leave a row no token at all (no_repeat_ngram, say, forbidding the byte
    that would finish a character, and the UTF-8 rule forbidding EOS before it is finished). Such a
    row ends: EOS gets back the log-probability it had before the rules, so no search picks padding
    from a row of -inf, nor samples from NaN."""
    eos = log_probs[:, EOS_ID].clone()
    if too_short is not None:
        log_probs[too_short, EOS_ID] = float("-inf")
    if no_repeat_ngram:
        ban_repeated_ngrams(log_probs, history, no_repeat_ngram)
    for constraint in constraints:
        constraint.restrict(log_probs, history, steps_left)
    stuck = torch.isneginf(log_probs).all(dim=1)
    if stuck.any():
        log_probs[stuck, EOS_ID] = eos[stuck]
    return log_probs


def rows_at_limit(step: int, limits: torch.Tensor, shortest_limit: int) -> Optional[torch.Tensor]:
    """(rows,) whether each row has reached its limit at this step; None while none can have."""
    return step >= limits if step >= shortest_limit else None


def output_constraints(target: Tokenizer, options: DecodeConfig) -> tuple[OutputConstraint, ...]:
    """What every output of attn's own search keeps to: valid UTF-8 when the target tokenizer has
    byte pieces (no output decodes to U+FFFD), no stutter when `decode.no_stutter` asks and no loop
    when `decode.no_loops` does."""
    return _constraints_of(target, options.no_stutter, options.no_loops)


@functools.lru_cache(maxsize=8)
def _constraints_of(target: Tokenizer, no_stutter: bool, no_loops: bool) -> tuple[OutputConstraint, ...]:
    """Built once per tokenizer and reused by every call: indexing a whole vocabulary takes longer
    than decoding a short sentence, and a server calls the search once per batch of requests. The
    constraints keep no state between searches."""
    constraints: list[OutputConstraint] = []
    valid_utf8 = Utf8Constraint.for_tokenizer(target)
    if valid_utf8 is not None:
        constraints.append(valid_utf8)
    if no_stutter:
        constraints.append(NoStutter.for_tokenizer(target))
    if no_loops:
        constraints.append(NoLoop.for_tokenizer(target))
    return tuple(constraints)
