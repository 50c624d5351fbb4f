"""Lexically constrained beam search: every output holds each of its sentence's terms, in the
manner of dynamic beam allocation (Post and Vilar, 2018).

A term is a set of alternatives, each a sequence of target ids; writing any one of them meets the
term. A `TermTracker` follows, for one sentence, what a hypothesis has met: the terms it has
written and the ones it is part way through (a `TermState`).

Each step, a sentence's candidates are the extensions that an unconstrained beam would weigh (the
2k best of all its hypotheses' extensions), each hypothesis's own best next token, and each
hypothesis's tokens that advance a term (the next token of a term it is writing, the first token
of every term it has not met). A candidate is dropped when its unmet terms could no longer fit
before the sentence's length limit, and a hypothesis may end only once it has met every term; so a
sentence that can meet its terms at all ends with them met.

The candidates are then banked by progress: terms met, then tokens into the term being written.
The beam is shared across the banks in turns, from the most advanced down: each bank's best, then
each bank's second best, and so on (a bank with too few candidates leaves its turns to the others),
until k are chosen. Among those k, the ones that end are finished; the beam goes on with the
first k in that order that do not end. With no terms there is one bank, and the search is the
plain beam search of `attn_cli.decoding.beam`.

A sentence whose terms cannot all fit within its length limit, counted from its prefix, is
searched without the longest of them until the others fit; one whose every hypothesis is ruled out
on the way (by the output constraints, say, forbidding a term's tokens) returns no hypothesis.
Terms are counted apart: two terms that could share tokens are still given room for both. In a
language written with spaces, the token after a term may not glue onto its last word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Optional, Sequence

import torch

from attn_cli.decoding.beam import BeamState, check_n_best, run_beam
from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.glossary import TokenTerm
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.decoding.search import SearchSettings, prefix_and_bounds
from attn_cli.model import Transformer
from attn_cli.vocab import EOS_ID


@dataclass(frozen=True)
class TermState:
    met: frozenset[int]  # the terms written, by index
    writing: tuple[tuple[int, int, int], ...]  # (term, alternative, tokens written of it) part way through
    just_met: bool = False  # whether the last token ended a term


class TermTracker:
    """What a hypothesis of one sentence has met of the sentence's terms."""

    def __init__(self, terms: Sequence[TokenTerm]):
        self.terms = tuple(terms)
        if any(not alternatives or not all(alternatives) for alternatives in self.terms):
            raise ValueError("every term needs at least one alternative, and every alternative a token")
        self.shortest = [min(len(alternative) for alternative in alternatives) for alternatives in self.terms]
        # A term's alternatives by their first token.
        self.starting: dict[int, list[tuple[int, int]]] = {}
        for term, alternatives in enumerate(self.terms):
            for number, alternative in enumerate(alternatives):
                self.starting.setdefault(alternative[0], []).append((term, number))
        self._advanced: dict[tuple[TermState, int], TermState] = {}

    def start(self, prefix: Sequence[int]) -> TermState:
        """The state after a forced prefix: what the prefix writes counts."""
        state = TermState(frozenset(), ())
        for token in prefix:
            state = self.advance(state, token)
        return state

    def advance(self, state: TermState, token: int) -> TermState:
        """The state after writing `token`. Every partial match is followed at once (a token may
        go on one term and start another), so no occurrence is missed."""
        key = (state, token)
        if key not in self._advanced:
            met = set(state.met)
            writing = []
            candidates = [(term, number, written) for term, number, written in state.writing]
            candidates += [(term, number, 0) for term, number in self.starting.get(token, ()) if term not in met]
            for term, number, written in candidates:
                alternative = self.terms[term][number]
                if alternative[written] != token:
                    continue
                if written + 1 == len(alternative):
                    met.add(term)
                else:
                    writing.append((term, number, written + 1))
            kept = tuple(sorted({entry for entry in writing if entry[0] not in met}))
            self._advanced[key] = TermState(frozenset(met), kept, len(met) > len(state.met))
        return self._advanced[key]

    def complete(self, state: TermState) -> bool:
        return len(state.met) == len(self.terms)

    def needed(self, state: TermState) -> int:
        """The fewest tokens that would meet every term not yet met, counting each term apart: the
        unmet terms from scratch, or one term being written finished first (only one can go on:
        the next token breaks off every other) and the rest from scratch."""
        from_scratch = sum(shortest for term, shortest in enumerate(self.shortest) if term not in state.met)
        going_on = [
            len(self.terms[term][number]) - written - self.shortest[term] for term, number, written in state.writing
        ]
        return from_scratch + min([0, *going_on])

    def next_tokens(self, state: TermState) -> set[int]:
        """The tokens that advance a term: the next of each one being written, the first of each unmet one."""
        tokens = {self.terms[term][number][written] for term, number, written in state.writing}
        for term, alternatives in enumerate(self.terms):
            if term not in state.met:
                tokens.update(alternative[0] for alternative in alternatives)
        return tokens

    def bank(self, state: TermState) -> tuple[int, int]:
        """Progress, compared as a pair: terms met, then tokens into the furthest term being written."""
        return len(state.met), max((written for _, _, written in state.writing), default=0)


@torch.inference_mode()
def constrained_beam_search(
    model: Transformer | Ensemble,
    src: torch.Tensor,
    terms: Sequence[Sequence[TokenTerm]],
    settings: SearchSettings,
    prefix: Optional[torch.Tensor] = None,
    word_continuations: Sequence[Collection[int]] = (),
) -> list[list[Hypothesis]]:
    """`beam_search` (same arguments) where every output of row b of `src` holds each of `terms[b]`.
    A row whose every hypothesis was ruled out gets an empty list. `word_continuations[b]` are the
    tokens that would glue onto the word before them in row b's output language (where words are
    spaced, pieces that do not begin a word): none may follow a term's last token, so "cat" is not
    met by "cats". None for any row when not given."""
    check_n_best(settings)
    if len(terms) != src.shape[0]:
        raise ValueError(f"{len(terms)} term lists for {src.shape[0]} sentences; give one per sentence")
    if word_continuations and len(word_continuations) != src.shape[0]:
        raise ValueError(f"{len(word_continuations)} word-continuation sets for {src.shape[0]} sentences")
    ensemble = Ensemble.of(model)
    prefix, floors, limits = prefix_and_bounds(src, prefix, ensemble.max_target_tokens, settings)
    search = BankedBeamState(ensemble, src, settings, floors, limits, prefix, terms, word_continuations)
    return run_beam(search, ensemble, settings)


class BankedBeamState(BeamState):
    """A `BeamState` that chooses each next beam by dynamic beam allocation over the terms' banks."""

    def __init__(
        self,
        ensemble,
        src,
        settings: SearchSettings,
        floors,
        limits,
        prefix,
        terms: Sequence[Sequence[TokenTerm]],
        word_continuations: Sequence[Collection[int]] = (),
    ):
        super().__init__(ensemble, src, settings, floors, limits, prefix)
        glued = word_continuations or [()] * src.shape[0]
        self.glued = [torch.tensor(sorted(tokens), dtype=torch.long, device=src.device) for tokens in glued]
        self.trackers: list[TermTracker] = []  # per live sentence, as `glued`
        self.states: list[TermState] = []  # per live hypothesis, rows as in `history`
        for row, (sentence_terms, limit) in enumerate(zip(terms, limits.tolist())):
            tracker, start = _fitting(sentence_terms, prefix[row].tolist(), limit)
            self.trackers.append(tracker)
            self.states += [start] * self.k

    def _choose(self, log_probs: torch.Tensor, step: int, could_end: bool) -> tuple[list, list, list]:
        live, k = self.scores.shape
        vocab = log_probs.shape[1]
        # Only a hypothesis that has met every term may end.
        unfinished = [row for row, state in enumerate(self.states) if not self.trackers[row // k].complete(state)]
        if unfinished:
            log_probs[unfinished, EOS_ID] = float("-inf")
        # A term just written ends its word.
        for row, state in enumerate(self.states):
            if state.just_met and self.glued[row // k].numel():
                log_probs[row, self.glued[row // k]] = float("-inf")
        row_scores = self.scores.view(-1)
        candidates = (row_scores[:, None] + log_probs).view(live, k * vocab)
        top_scores, top_ids = candidates.topk(2 * k, dim=1)
        # Each hypothesis's best token and the tokens that advance its terms, scored in one gather.
        extra_rows, extra_tokens = [], []
        best_tokens = log_probs.argmax(dim=1).tolist()
        for row, state in enumerate(self.states):
            for token in {best_tokens[row], *self.trackers[row // k].next_tokens(state)}:
                extra_rows.append(row)
                extra_tokens.append(token)
        extra_scores = (row_scores[extra_rows] + log_probs[extra_rows, extra_tokens]).tolist()
        steps_after = (self.limits - step - 1).tolist()  # tokens each sentence may add after this one

        per_sentence: list[dict[tuple[int, int], float]] = [{} for _ in range(live)]  # (origin, token) -> score
        for live_index, (sentence_scores, sentence_ids) in enumerate(zip(top_scores.tolist(), top_ids.tolist())):
            for score, flat_id in zip(sentence_scores, sentence_ids):
                per_sentence[live_index][divmod(flat_id, vocab)] = score
        for row, token, score in zip(extra_rows, extra_tokens, extra_scores):
            per_sentence[row // k][(row % k, token)] = score

        scores, rows, tokens, states = [], [], [], []
        for live_index, found in enumerate(per_sentence):
            tracker = self.trackers[live_index]
            banked = []  # (bank, score, origin, token, state)
            for (origin, token), score in found.items():
                if not math.isfinite(score):
                    continue
                state = self.states[live_index * k + origin]
                if token != EOS_ID:
                    state = tracker.advance(state, token)
                    if tracker.needed(state) > steps_after[live_index]:
                        continue  # its terms could no longer fit
                banked.append((tracker.bank(state), score, origin, token, state))
            going_on = []
            for rank, (_, score, origin, token, state) in enumerate(_in_turns(banked)):
                if token != EOS_ID:
                    if len(going_on) < k:
                        going_on.append((score, origin, token, state))
                elif could_end and rank < k:
                    self._finish(live_index, live_index * k + origin, score, step)
                if len(going_on) == k and rank >= k - 1:
                    break
            if not going_on:  # every hypothesis was ruled out: the sentence goes on with none alive
                going_on = [(float("-inf"), 0, int(top_ids[live_index, 0]) % vocab, self.states[live_index * k])]
            going_on += [(float("-inf"), *going_on[0][1:])] * (k - len(going_on))
            for score, origin, token, state in going_on:
                scores.append(score)
                rows.append(live_index * k + origin)
                tokens.append(token)
                states.append(state)
        self.states = states
        return scores, rows, tokens

    def _keep_sentences(self, kept: torch.Tensor) -> None:
        super()._keep_sentences(kept)
        k = self.k
        self.trackers = [self.trackers[i] for i in kept.tolist()]
        self.glued = [self.glued[i] for i in kept.tolist()]
        self.states = [state for i in kept.tolist() for state in self.states[i * k : (i + 1) * k]]


def _fitting(terms: Sequence[TokenTerm], prefix: list[int], limit: int) -> tuple[TermTracker, TermState]:
    """The tracker of the sentence's terms that fit within its limit, and its start after the
    prefix: while they do not fit, the longest term is left out (to be named unmet afterwards)."""
    kept = list(terms)
    while True:
        tracker = TermTracker(kept)
        start = tracker.start(prefix)
        if tracker.needed(start) <= limit:
            return tracker, start
        longest = max(range(len(kept)), key=lambda t: (tracker.shortest[t], t))
        del kept[longest]


def _in_turns(banked: list) -> list:
    """Candidates (bank, score, origin, token, state) in the order the beam takes them: the best of
    each bank, from the most advanced bank down, then the second best of each, and so on."""
    by_bank: dict[tuple[int, int], list] = {}
    for candidate in sorted(banked, key=lambda c: (-c[1], c[2], c[3])):  # best first; ties by origin, token
        by_bank.setdefault(candidate[0], []).append(candidate)
    turns = [
        (rank, tuple(-x for x in bank), candidate)
        for bank, members in by_bank.items()
        for rank, candidate in enumerate(members)
    ]
    turns.sort(key=lambda t: (t[0], t[1]))
    return [candidate for _, _, candidate in turns]
