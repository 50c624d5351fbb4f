"""Beam search written for clarity, not speed: one sentence at a time, no cache, plain lists.

The batched search in `attn_cli.decoding.beam` must return exactly what this returns. Both follow the same
rules: rank every extension of every hypothesis by summed log-probability; among the k best,
those ending in EOS are finished; the beam goes on with the k best that do not end; a sentence is
done when no live hypothesis can beat its k-th best finished one.
"""

from __future__ import annotations

import torch

from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.hypothesis import Hypothesis, length_penalty
from attn_cli.decoding.search import SearchSettings, output_bounds
from attn_cli.vocab import BOS_ID, EOS_ID


def _done(beam, finished: list[Hypothesis], beam_size: int, alpha: float, step: int, limit: int) -> bool:
    """No live hypothesis left, or none that can still beat the k-th best finished one."""
    if not beam:
        return True
    best = max(log_prob for _, log_prob in beam)
    best_possible = max(best / length_penalty(step + 2, alpha), best / length_penalty(limit + 1, alpha))
    return len(finished) == beam_size and finished[-1].score >= best_possible


@torch.no_grad()
def reference_beam_search(
    model,
    src_row: torch.Tensor,
    beam_size: int,
    alpha: float,
    max_len_a: float,
    max_len_b: int,
    n_best: int,
    prefix: tuple[int, ...] = (),
) -> list[Hypothesis]:
    """The n best hypotheses for one source sentence (S,), without padding, from one model or an
    `Ensemble`. A forced `prefix` starts the one first hypothesis, with log-probability 0; steps and
    length penalties count what follows it."""
    model = Ensemble.of(model)
    src = src_row[None]
    encoded = model.encode(src)
    settings = SearchSettings(max_len_a=max_len_a, max_len_b=max_len_b)
    limit = int(output_bounds(model.max_target_tokens, src, settings, len(prefix))[1][0])
    beam = [(list(prefix), 0.0)]  # (tokens so far, summed log-probability)
    finished: list[Hypothesis] = []
    for step in range(limit + 1):
        candidates = []
        for tokens, log_prob in beam:
            history = torch.tensor([[BOS_ID] + tokens], device=src.device)
            # the whole history, every step, without a cache
            at_limit = torch.tensor([step >= limit], device=src.device)
            next_log_probs = model.next_log_probs(history, encoded, None, at_limit, exact=False)[0]
            totals = torch.tensor(log_prob, dtype=torch.float32, device=src.device) + next_log_probs  # as batched
            for token, total in enumerate(totals.tolist()):
                if total != float("-inf"):
                    candidates.append((total, tokens, token))
        candidates.sort(key=lambda c: c[0], reverse=True)
        for total, tokens, token in candidates[:beam_size]:
            if token == EOS_ID:
                finished.append(Hypothesis(tokens, total, total / length_penalty(step + 1, alpha), step + 1))
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:beam_size]
        beam = [(tokens + [token], total) for total, tokens, token in candidates if token != EOS_ID][:beam_size]
        if _done(beam, finished, beam_size, alpha, step, limit):
            break
    return finished[:n_best]


def _ends_with(tokens: list[int], part: tuple[int, ...]) -> bool:
    return len(tokens) >= len(part) and tuple(tokens[len(tokens) - len(part) :]) == part


def _holds(tokens: list[int], alternative: tuple[int, ...]) -> bool:
    n = len(alternative)
    return any(tuple(tokens[i : i + n]) == alternative for i in range(len(tokens) - n + 1))


class _PlainTerms:
    """What a token list has met of a sentence's terms, worked out from the whole list each time."""

    def __init__(self, terms):
        self.terms = terms

    def met(self, tokens):
        return [any(_holds(tokens, alternative) for alternative in term) for term in self.terms]

    def started(self, tokens, term):
        """(alternative, tokens of it written) for each proper start of an alternative the list ends with."""
        return [(a, j) for a in term for j in range(1, len(a)) if _ends_with(tokens, a[:j])]

    def needed(self, tokens):
        """Every unmet term from scratch, or one being written finished first and the rest from scratch."""
        met = self.met(tokens)
        shortest = [min(len(a) for a in term) for term in self.terms]
        unmet = [t for t, done in enumerate(met) if not done]
        options = [sum(shortest[t] for t in unmet)]
        for t in unmet:
            for a, j in self.started(tokens, self.terms[t]):
                options.append(sum(shortest[u] for u in unmet if u != t) + len(a) - j)
        return min(options)

    def just_met(self, tokens):
        return bool(tokens) and sum(self.met(tokens)) > sum(self.met(tokens[:-1]))

    def bank(self, tokens):
        met = self.met(tokens)
        furthest = [j for term, done in zip(self.terms, met) if not done for _, j in self.started(tokens, term)]
        return sum(met), max(furthest, default=0)

    def next_tokens(self, tokens):
        met = self.met(tokens)
        found = set()
        for term, done in zip(self.terms, met):
            if not done:
                found.update(a[0] for a in term)
                found.update(a[j] for a, j in self.started(tokens, term))
        return found


@torch.no_grad()
def reference_constrained_search(
    model,
    src_row: torch.Tensor,
    terms,
    beam_size: int,
    alpha: float,
    max_len_a: float,
    max_len_b: int,
    n_best: int,
    prefix: tuple[int, ...] = (),
    word_continuations: frozenset[int] = frozenset(),
) -> list[Hypothesis]:
    """Dynamic beam allocation for one sentence, plainly: the candidates are the 2k best extensions,
    each hypothesis's best token and its term tokens; those whose terms can no longer fit are
    dropped, only a hypothesis that met every term may end, and none of `word_continuations` may
    follow a term's last token; the beam takes the candidates in turns over the banks (terms met,
    then tokens into a term), best bank first. Terms that cannot all fit are left out, longest
    first, until the others do."""
    model = Ensemble.of(model)
    src = src_row[None]
    encoded = model.encode(src)
    settings = SearchSettings(max_len_a=max_len_a, max_len_b=max_len_b)
    limit = int(output_bounds(model.max_target_tokens, src, settings, len(prefix))[1][0])
    kept = [tuple(tuple(a) for a in term) for term in terms]
    while _PlainTerms(kept).needed(list(prefix)) > limit:
        longest = max(range(len(kept)), key=lambda t: (min(len(a) for a in kept[t]), t))
        del kept[longest]
    plain = _PlainTerms(kept)
    beam = [(list(prefix), 0.0)]
    finished: list[Hypothesis] = []
    for step in range(limit + 1):
        extensions = []  # (total, origin, token)
        extra = set()
        for origin, (tokens, log_prob) in enumerate(beam):
            history = torch.tensor([[BOS_ID] + tokens], device=src.device)
            at_limit = torch.tensor([step >= limit], device=src.device)
            next_log_probs = model.next_log_probs(history, encoded, None, at_limit, exact=False)[0]
            if not all(plain.met(tokens)):
                next_log_probs[EOS_ID] = float("-inf")
            if plain.just_met(tokens):
                for token in word_continuations:
                    next_log_probs[token] = float("-inf")
            totals = torch.tensor(log_prob, dtype=torch.float32, device=src.device) + next_log_probs
            values = totals.tolist()
            extensions += [(total, origin, token) for token, total in enumerate(values)]
            best = max(range(len(values)), key=lambda t: (next_log_probs[t].item(), -t))
            extra |= {(origin, token, values[token]) for token in {best, *plain.next_tokens(tokens)}}
        extensions.sort(key=lambda e: (-e[0], e[1], e[2]))
        chosen = {(origin, token): total for total, origin, token in extensions[: 2 * beam_size]}
        chosen.update({(origin, token): total for origin, token, total in extra})
        banked = []
        for (origin, token), total in chosen.items():
            if total == float("-inf"):
                continue
            tokens = beam[origin][0] + ([] if token == EOS_ID else [token])
            if token != EOS_ID and plain.needed(tokens) > limit - step - 1:
                continue
            banked.append((plain.bank(tokens), total, origin, token))
        by_bank: dict = {}
        for candidate in sorted(banked, key=lambda c: (-c[1], c[2], c[3])):
            by_bank.setdefault(candidate[0], []).append(candidate)
        order = sorted(
            ((rank, tuple(-x for x in bank), c) for bank, members in by_bank.items() for rank, c in enumerate(members)),
            key=lambda t: (t[0], t[1]),
        )
        order = [c for _, _, c in order]
        for _, total, origin, token in order[:beam_size]:
            if token == EOS_ID:
                finished.append(Hypothesis(beam[origin][0], total, total / length_penalty(step + 1, alpha), step + 1))
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:beam_size]
        beam = [(beam[origin][0] + [token], total) for _, total, origin, token in order if token != EOS_ID][:beam_size]
        if _done(beam, finished, beam_size, alpha, step, limit):
            break
    return finished[:n_best]
