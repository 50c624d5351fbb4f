"""Greedy decoding and sampling on top of `Transformer.encode`/`decode` and the KV cache, for one
model or an `Ensemble` (`ensemble.py`). Beam search lives in `beam.py`, the pieces every search
shares in `search.py`."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from attn_cli.decoding.ensemble import Ensemble, EnsembleEncoded
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.decoding.search import SearchSettings, prefix_and_bounds, restrict_next_tokens, rows_at_limit
from attn_cli.model import Transformer
from attn_cli.vocab import BOS_ID, EOS_ID

# A rule that picks the next token of every row from its (rows, V) log-probabilities.
TokenChooser = Callable[[torch.Tensor], torch.Tensor]


def choose_most_likely(log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs.max(dim=-1).indices  # on the CPU, faster than argmax over a vocabulary


def sampler(
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, generator: Optional[torch.Generator] = None
) -> TokenChooser:
    """Sample from the distribution sharpened or flattened by `temperature`, restricted to the
    `top_k` most likely tokens (0 = all) and to the smallest set whose probability reaches `top_p`."""

    def choose(log_probs: torch.Tensor) -> torch.Tensor:
        logits = log_probs / temperature
        if top_k > 0:
            kth_best = logits.topk(min(top_k, logits.shape[1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth_best, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            # Drop a token when the more likely ones already reach top_p; the best always stays.
            drop = probs.cumsum(dim=-1) - probs >= top_p
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)

    return choose


def greedy_search(
    model: Transformer | Ensemble,
    src: torch.Tensor,
    settings: SearchSettings = SearchSettings(),
    prefix: Optional[torch.Tensor] = None,
    choose: TokenChooser = choose_most_likely,
    use_cache: bool = True,
    scored: bool = True,
) -> list[list[Hypothesis]]:
    """Decode a batch (B, S) one token at a time; each sentence stops at its own EOS or its limit.

    `model` is one model or an `Ensemble`. `choose` picks each next token: the most likely (greedy)
    or a `sampler`; `settings.n_best` > 1 draws that many outputs per source. A sentence that has
    ended leaves the batch, so the long ones do not keep the finished ones computing. `settings`
    give the output limits, the length penalty that scores each hypothesis and the rules every
    output keeps (`settings.beam_size` is not read). `prefix` (B, P), the same length P for every
    row, is forced: every output begins with it, and the search continues from there (see
    `Hypothesis` for how it is scored). `use_cache=False` re-runs the decoder over the whole history
    at every step (the reference the cache is tested and benchmarked against). `scored=False`
    (greedy only) skips the scores, and the log-softmax they need at every step, and leaves them NaN.
    Returns `settings.n_best` hypotheses per source.
    """
    with torch.inference_mode():  # a search records no gradients
        if not scored and choose is not choose_most_likely:
            raise ValueError("sampling needs normalized scores")
        ensemble = Ensemble.of(model)
        samples, exact = settings.n_best, settings.exact_steps is not None
        prefix, floors, limits = prefix_and_bounds(src, prefix, ensemble.max_target_tokens, settings)
        encoded = ensemble.encode(src)
        if samples > 1:  # rows b*samples .. b*samples+samples-1 decode source b
            rows = torch.arange(src.shape[0], device=src.device).repeat_interleave(samples)
            encoded, floors, limits, prefix = encoded.select(rows), floors[rows], limits[rows], prefix[rows]
        steps = settings.exact_steps if exact else int(limits.max()) + 1  # + 1 for the EOS
        shortest_limit = int(limits.min())
        cache = ensemble.new_cache() if use_cache else None
        state = _GreedyState(encoded, floors, limits, prefix, scored)
        for step in range(steps):  # step: tokens searched so far, after the prefix
            settings.check_stop()
            # The cache's first call takes BOS and the whole prefix at once; each later call, the last token.
            new_tokens = state.history[:, cache.steps :] if cache is not None else state.history
            at_limit = rows_at_limit(step, state.limits, shortest_limit)
            log_probs = ensemble.next_log_probs(new_tokens, state.encoded, cache, at_limit, exact, normalize=scored)
            if settings.restricts:
                restrict_next_tokens(
                    log_probs,
                    state.history,
                    state.limits - step,
                    settings.no_repeat_ngram,
                    settings.rules,
                    step < state.floors,
                )
            next_tokens = choose(log_probs)
            state.extend(next_tokens, log_probs.gather(1, next_tokens[:, None]).squeeze(1) if scored else None)
            ended = next_tokens == EOS_ID
            if ended.any():
                kept = state.finish(ended, settings.length_penalty)
                if not kept.numel():
                    break
                if cache is not None:
                    cache.select(kept, source_rows=kept)
        state.finish(
            torch.ones_like(state.alive, dtype=torch.bool), settings.length_penalty
        )  # exact_steps: whatever is left
        return [state.results[b * samples : (b + 1) * samples] for b in range(src.shape[0])]


class _GreedyState:
    """The rows still decoding, their tokens and log-probabilities, and the finished results."""

    def __init__(
        self, encoded: EnsembleEncoded, floors: torch.Tensor, limits: torch.Tensor, prefix: torch.Tensor, scored: bool
    ):
        rows = limits.shape[0]
        self.encoded = encoded
        self.floors = floors  # (rows,) tokens each row must search after its prefix before it may end
        self.limits = limits  # (rows,) tokens each row may search after its prefix, before its EOS
        self.forced = prefix.shape[1]  # the prefix's tokens, which start every output
        self.alive = torch.arange(rows, device=prefix.device)  # the result slot of each row still decoding
        bos = torch.full((rows, 1), BOS_ID, dtype=torch.long, device=prefix.device)
        self.history = torch.cat([bos, prefix], dim=1)  # (rows, 1 + P + steps): BOS, prefix, searched tokens
        self.log_prob = torch.full((rows,), 0.0 if scored else float("nan"), device=prefix.device)
        self.results: list[Optional[Hypothesis]] = [None] * rows

    def extend(self, next_tokens: torch.Tensor, log_probs: Optional[torch.Tensor]) -> None:
        self.history = torch.cat([self.history, next_tokens[:, None]], dim=1)
        if log_probs is not None:  # None: not scored, and log_prob stays NaN
            self.log_prob += log_probs

    def finish(self, ended: torch.Tensor, alpha: float) -> torch.Tensor:
        """Record the rows that ended and drop them from the batch; returns the rows kept."""
        for row in ended.nonzero().squeeze(1).tolist():
            tokens = self.history[row, 1:].tolist()
            if len(tokens) > self.forced and tokens[-1] == EOS_ID:
                tokens.pop()
            log_prob = self.log_prob[row].item()
            searched = len(tokens) - self.forced
            self.results[self.alive[row]] = Hypothesis.scored(tokens, log_prob, searched + 1, alpha)
        kept = (~ended).nonzero().squeeze(1)
        self.alive, self.history, self.log_prob = self.alive[kept], self.history[kept], self.log_prob[kept]
        self.floors, self.limits, self.encoded = self.floors[kept], self.limits[kept], self.encoded.select(kept)
        return kept


def greedy_decode(
    model: Transformer, src: torch.Tensor, settings: SearchSettings = SearchSettings(), use_cache: bool = True
) -> list[list[int]]:
    """The greedy output ids of each source sentence, without scores (see `greedy_search`)."""
    results = greedy_search(model, src, settings, use_cache=use_cache, scored=False)
    return [hypotheses[0].tokens for hypotheses in results]
