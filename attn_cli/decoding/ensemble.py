"""Several models that decode as one: the interface greedy and beam search use from a model.

A search encodes the batch once (`encode`), makes a cache (`new_cache`), asks for the next-token
log-probabilities of every row (`next_log_probs`), and drops or reorders rows (`select` on the
encoder output and on the cache). An `Ensemble` does each for every member model, which keeps its
own encoder output and KV cache, and combines the next-token distributions as the mean of the
members' log-probabilities. A single model is an ensemble of one, so the searches have one code path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from attn_cli.decoding.search import next_token_log_probs
from attn_cli.model import Encoded, KVCache, Transformer


class EnsembleEncoded:
    """Each member's encoder output for the same source rows."""

    def __init__(self, per_model: list[Encoded]):
        self.per_model = per_model

    def select(self, rows: torch.Tensor) -> "EnsembleEncoded":
        return EnsembleEncoded([encoded.select(rows) for encoded in self.per_model])


class EnsembleCache:
    """Each member's KV cache; selecting rows (finished sentences leaving, beams reordering) selects
    them in every member's cache, so no member's history drifts from the hypotheses."""

    def __init__(self, per_model: list[KVCache]):
        self.per_model = per_model

    @property
    def steps(self) -> int:
        """Target positions already in the cache (the same in every member's)."""
        return self.per_model[0].steps

    def select(self, rows: torch.Tensor, source_rows: Optional[torch.Tensor] = None) -> None:
        for cache in self.per_model:
            cache.select(rows, source_rows)


class Ensemble:
    """Models that share the target vocabulary, searched as one."""

    def __init__(self, models: Sequence[Transformer]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)

    @classmethod
    def of(cls, model: Transformer | Ensemble) -> Ensemble:
        """`model` itself if it is an ensemble, else an ensemble of that one model."""
        return model if isinstance(model, Ensemble) else cls([model])

    @property
    def device(self) -> torch.device:
        return next(self.models[0].parameters()).device

    @property
    def max_target_tokens(self) -> Optional[int]:
        """The fewest output tokens any member can embed; None when none has a limit."""
        limits = [m.max_target_tokens for m in self.models if m.max_target_tokens is not None]
        return min(limits) if limits else None

    def encode(self, src: torch.Tensor) -> EnsembleEncoded:
        return EnsembleEncoded([model.encode(src) for model in self.models])

    def new_cache(self, hypotheses: int = 1) -> EnsembleCache:
        return EnsembleCache([model.new_cache(hypotheses) for model in self.models])

    def next_log_probs(
        self,
        tokens: torch.Tensor,
        encoded: EnsembleEncoded,
        cache: Optional[EnsembleCache],
        at_limit: Optional[torch.Tensor],
        exact: bool,
        normalize: bool = True,
    ) -> torch.Tensor:
        """(rows, V) log-probabilities of the token after the last of `tokens` (rows, T): with a cache,
        the positions it does not hold yet (T > 1 fills it for all of them in one decoder call);
        without one, the whole history. `at_limit`, `exact` and `normalize` as in
        `next_token_log_probs`.

        Several members: the mean of their log-probabilities, each from its own log-softmax. One
        member: its own log-probabilities, as they are. With `normalize=False` (greedy decoding
        without scores) the mean is of the members' logits: it differs from the mean of their
        log-probabilities by one number per row, so it ranks the tokens alike.
        """
        caches = cache.per_model if cache is not None else [None] * len(self.models)
        per_model = [
            next_token_log_probs(model.decode(tokens, member_encoded, member_cache)[:, -1], at_limit, exact, normalize)
            for model, member_encoded, member_cache in zip(self.models, encoded.per_model, caches)
        ]
        if len(per_model) == 1:
            return per_model[0]
        # (members, rows, V) -> (rows, V). A token a member rules out (-inf) stays ruled out.
        return torch.stack(per_model).mean(dim=0)
