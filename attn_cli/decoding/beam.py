"""Batched beam search over the KV cache.

Every live sentence keeps `beam_size` hypotheses, stored as rows b*k .. b*k+k-1 of the decoder
batch. At each step the k*V extensions of a sentence's hypotheses are ranked by summed
log-probability. Among the k best, those that end in EOS are finished (scored with the GNMT
length penalty); the beam goes on with the k best that do not end. The self-attention cache is
then reordered by each surviving hypothesis's origin. Cross-attention keys and values stay at one
row per source sentence (attention groups the k hypotheses of a sentence onto them).

A sentence is done when none of its hypotheses can still beat the worst of its k best finished
ones, or when it reaches its length limit; it then leaves the batch.

With a forced prefix, each sentence starts from one hypothesis, BOS and the prefix, with
log-probability 0: the search, its steps, limits and length penalties count the tokens after the
prefix, which all hypotheses of a sentence share (see `Hypothesis`). The model may be one
`Transformer` or an `Ensemble`; every member's cache is reordered alike.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.hypothesis import Hypothesis, length_penalty
from attn_cli.decoding.search import SearchSettings, prefix_and_bounds, restrict_next_tokens, rows_at_limit
from attn_cli.model import Transformer
from attn_cli.vocab import BOS_ID, EOS_ID


@torch.inference_mode()
def beam_search(
    model: Transformer | Ensemble,
    src: torch.Tensor,
    settings: SearchSettings,
    prefix: Optional[torch.Tensor] = None,
) -> list[list[Hypothesis]]:
    """The `settings.n_best` best hypotheses of each source sentence in the batch (B, S), best first.

    `model` is one model or an `Ensemble`. `settings.length_penalty` is the length penalty exponent (0 ranks
    by log-probability alone). `prefix` (B, P), the same length P for every row, is forced: every
    hypothesis begins with it.
    """
    check_n_best(settings)
    ensemble = Ensemble.of(model)
    prefix, floors, limits = prefix_and_bounds(src, prefix, ensemble.max_target_tokens, settings)
    search = BeamState(ensemble, src, settings, floors, limits, prefix)
    return run_beam(search, ensemble, settings)


def check_n_best(settings: SearchSettings) -> None:
    if not 1 <= settings.n_best <= settings.beam_size:
        raise ValueError(f"n_best={settings.n_best} must be between 1 and the beam size {settings.beam_size}")


def run_beam(search: BeamState, ensemble: Ensemble, settings: SearchSettings) -> list[list[Hypothesis]]:
    """The steps of a beam search from its start `search` (a `BeamState`, or one that chooses its
    beam by other rules): decode, restrict, choose, reorder the cache, until every sentence is done."""
    beam_size, exact = search.k, settings.exact_steps is not None
    cache = ensemble.new_cache(hypotheses=beam_size)  # a sentence's k rows share its cross-attention keys
    steps = settings.exact_steps if exact else int(search.limits.max()) + 1  # + 1 for the EOS
    for step in range(steps):  # step: tokens searched so far, after the prefix
        settings.check_stop()
        at_limit = rows_at_limit(step, search.limits, search.shortest_limit)
        if at_limit is not None:
            at_limit = at_limit.repeat_interleave(beam_size)
        # The first call fills the cache with BOS and the whole prefix at once; each later call, the last token.
        log_probs = ensemble.next_log_probs(search.history[:, cache.steps :], search.encoded, cache, at_limit, exact)
        if settings.restricts:
            steps_left = (search.limits - step).repeat_interleave(beam_size)
            too_short = (step < search.floors).repeat_interleave(beam_size)
            restrict_next_tokens(
                log_probs, search.history, steps_left, settings.no_repeat_ngram, settings.rules, too_short
            )
        rows, sources = search.advance(log_probs, step, could_end=not exact)
        if not rows.numel():
            break
        cache.select(rows, sources)
    if exact:
        search.finish_all_alive(settings.exact_steps)
    return [hypotheses[: settings.n_best] for hypotheses in search.finished]


class BeamState:
    """The live sentences' hypotheses and the finished ones of every sentence."""

    def __init__(
        self,
        ensemble: Ensemble,
        src: torch.Tensor,
        settings: SearchSettings,
        floors: torch.Tensor,
        limits: torch.Tensor,
        prefix: torch.Tensor,
    ):
        batch, device = src.shape[0], src.device
        self.k, self.alpha = settings.beam_size, settings.length_penalty
        self.encoded = ensemble.encode(src)
        self.floors = floors  # (live,) tokens each live sentence must search after its prefix before it may end
        self.limits = limits  # (live,) tokens each live sentence may search after its prefix, before its EOS
        # Length penalties at each sentence's longest possible output (its limit plus EOS).
        self.penalty_at_limit = length_penalty((limits + 1).float(), self.alpha)
        self.shortest_limit = int(limits.min())  # before this step, no sentence is at its limit
        self.full = False  # whether some sentence holds k finished hypotheses yet
        self.sentence = torch.arange(batch, device=device)  # the input index of each live sentence
        # Summed log-probability of each hypothesis; a sentence starts with one, so the other
        # k - 1 start at -inf and the first step's k best all extend the one BOS and prefix.
        self.scores = torch.full((batch, self.k), float("-inf"), device=device)
        self.scores[:, 0] = 0.0
        bos = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=device)
        # (live*k, 1 + P + steps): BOS, the prefix, the searched tokens; rows b*k .. b*k+k-1 are sentence b's.
        self.history = torch.cat([bos, prefix], dim=1).repeat_interleave(self.k, dim=0)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(batch)]  # best first, at most k each
        self.worst_kept = torch.full((batch,), float("-inf"), device=device)  # k-th best finished score

    def advance(
        self, log_probs: torch.Tensor, step: int, could_end: bool = True
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Take one step from the (live*k, V) log-probabilities of output position `step`.

        Returns the cache rows to keep, in their new order, and the source rows to keep (None when
        no sentence left the batch). `could_end=False` (forced-length decoding) skips the checks
        for finished hypotheses and sentences.
        """
        live, k = self.scores.shape
        scores, rows, tokens = self._choose(log_probs, step, could_end)
        device = log_probs.device
        self.scores = torch.tensor(scores, dtype=log_probs.dtype, device=device).view(live, k)
        rows = torch.tensor(rows, device=device)  # (live*k,) the row each hypothesis continues
        self.history = torch.cat([self.history[rows], torch.tensor(tokens, device=device)[:, None]], dim=1)

        # Until some sentence has k finished hypotheses, only a sentence at its limit can be done.
        if not could_end or not (self.full or step >= self.shortest_limit):
            return rows, None
        done = self._done(step)
        if not done.any():
            return rows, None
        kept = (~done).nonzero().squeeze(1)
        self._keep_sentences(kept)
        return rows.view(live, k)[kept].view(-1), kept

    def _choose(self, log_probs: torch.Tensor, step: int, could_end: bool) -> tuple[list, list, list]:
        """The next beam from the (live*k, V) log-probabilities: per hypothesis, best first within
        each sentence, its summed log-probability, the row it continues and its new token. Finishes,
        on the way, the candidates that end among the k best."""
        live, k = self.scores.shape
        vocab = log_probs.shape[1]
        # (live*k, V) -> (live, k*V): all extensions of a sentence's hypotheses compete.
        candidates = (self.scores.view(-1, 1) + log_probs).view(live, k * vocab)
        # 2k candidates always hold k that do not end: at most k end (one EOS per hypothesis).
        top_scores, top_ids = candidates.topk(2 * k, dim=1)
        # What follows handles 2k numbers per sentence: plain Python on lists takes less time than
        # a dozen small tensor operations would.
        scores, rows, tokens = [], [], []
        for live_index, (candidate_scores, candidate_ids) in enumerate(zip(top_scores.tolist(), top_ids.tolist())):
            going_on = []  # (score, origin, token) of the k best candidates that do not end, best first
            for rank, (score, flat_id) in enumerate(zip(candidate_scores, candidate_ids)):
                origin, token = divmod(flat_id, vocab)
                if token != EOS_ID:
                    if len(going_on) < k:
                        going_on.append((score, origin, token))
                elif could_end and rank < k and math.isfinite(score):  # among the k best: finished
                    self._finish(live_index, live_index * k + origin, score, step)
            for score, origin, token in going_on:
                scores.append(score)
                rows.append(live_index * k + origin)
                tokens.append(token)
        return scores, rows, tokens

    def _keep_sentences(self, kept: torch.Tensor) -> None:
        """Only the live sentences `kept` (indices into the live ones) stay in the search."""
        k = self.k
        kept_rows = (kept[:, None] * k + torch.arange(k, device=kept.device)).view(-1)  # (kept*k,)
        self.scores, self.limits, self.sentence = self.scores[kept], self.limits[kept], self.sentence[kept]
        self.floors = self.floors[kept]
        self.worst_kept, self.encoded = self.worst_kept[kept], self.encoded.select(kept)
        self.penalty_at_limit = self.penalty_at_limit[kept]
        self.history = self.history[kept_rows]

    def _finish(self, live_index: int, row: int, log_prob: float, step: int) -> None:
        """A candidate that ends here, extending hypothesis `row`: kept if among its sentence's k
        best finished hypotheses."""
        length = step + 1  # tokens searched so far plus this EOS
        self._keep(live_index, Hypothesis.scored(self.history[row, 1:].tolist(), log_prob, length, self.alpha))

    def _keep(self, live_index: int, hypothesis: Hypothesis) -> None:
        kept = self.finished[int(self.sentence[live_index])]
        kept.append(hypothesis)
        kept.sort(key=lambda h: h.score, reverse=True)  # stable: earlier finishers win ties
        del kept[self.k :]
        if len(kept) == self.k:
            self.worst_kept[live_index] = kept[-1].score
            self.full = True

    def _done(self, step: int) -> torch.Tensor:
        """(live,) whether no live hypothesis of a sentence can beat its k best finished ones.

        A live hypothesis's log-probability only falls as it grows, and it will end with between
        step + 2 searched tokens (counting EOS) and limit + 1. Divided by a length penalty that changes
        monotonically with the length, its best possible score is at one end of that range.
        """
        best = self.scores.max(dim=1).values  # -inf when no hypothesis goes on
        shortest = best / length_penalty(step + 2, self.alpha)
        longest = best / self.penalty_at_limit
        return best.isneginf() | (self.worst_kept >= torch.maximum(shortest, longest))

    def finish_all_alive(self, steps: int) -> None:
        """For forced-length decoding: every live hypothesis is a result, as it stands."""
        for live_index in range(self.scores.shape[0]):
            for beam in range(self.k):
                log_prob = float(self.scores[live_index, beam])
                tokens = self.history[live_index * self.k + beam, 1:].tolist()
                self._keep(live_index, Hypothesis.scored(tokens, log_prob, steps, self.alpha))
