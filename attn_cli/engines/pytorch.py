"""attn's own engine: one checkpoint's model, or several decoded as an ensemble, searched by attn's
greedy, sampling, beam and constrained beam searches over the KV cache. It does everything an
engine can: prefixes, glossary terms, attention (one model), and the output rules inside its search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path
from typing import Optional

import torch

from attn_cli.config import Config, DecodeConfig
from attn_cli.data.collate import padded_sources
from attn_cli.data.lengths import LengthModel
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.decoding.attention_view import collect_attention
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.constrained import constrained_beam_search
from attn_cli.decoding.engine import Capabilities, Searcher, StopCheck
from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.glossary import TokenTerm, word_continuations
from attn_cli.decoding.greedy import greedy_search, sampler
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.decoding.records import Part
from attn_cli.decoding.search import SearchSettings, output_constraints
from attn_cli.model import Transformer
from attn_cli.vocab import EOS_ID, PAD_ID


class TorchEngine:
    """Models that share one tokenizer, searched as one (the mean of their log-probabilities)."""

    def __init__(
        self,
        models: Sequence[Transformer],
        tokenizers: Tokenizers,
        configs: Sequence[Config],
        paths: Sequence[Path] = (),
        lengths: Optional[LengthModel] = None,
    ):
        if not models or len(models) != len(configs):
            raise ValueError("give each model its config")
        self.models, self.tokenizers, self.config, self.paths = list(models), tokenizers, configs[0], list(paths)
        self.lengths = lengths  # the (first) model's training pairs' lengths; None when not known
        self.ensemble = Ensemble(self.models)
        self.max_source_tokens = min(config.model.max_sequence_tokens for config in configs)
        self.max_target_tokens = self.ensemble.max_target_tokens
        name = f"an ensemble of {len(models)} checkpoints" if len(models) > 1 else "the checkpoint"
        self.capabilities = Capabilities(
            name, "pytorch", prefix=True, terms=True, attention=len(models) == 1, output_rules=True, sampling=True
        )
        self._glued_by_language: dict[str, frozenset[int]] = {}  # asked for by a glossary only

    def _word_continuations(self, language: str) -> frozenset[int]:
        """The target pieces that would glue onto the word before them in `language`."""
        if language not in self._glued_by_language:
            self._glued_by_language[language] = word_continuations(self.tokenizers.target, language)
        return self._glued_by_language[language]

    @property
    def model(self) -> Transformer | Ensemble:
        """The one model, or the ensemble of several."""
        return self.models[0] if len(self.models) == 1 else self.ensemble

    def searcher(self, options: DecodeConfig, stop: Optional[StopCheck] = None) -> Searcher:
        device = self.ensemble.device
        generator = torch.Generator(device=device).manual_seed(options.seed) if options.seed is not None else None
        settings = SearchSettings.of(options, output_constraints(self.tokenizers.target, options), self.lengths)
        search = _Search(self.model, options, dataclasses.replace(settings, stop=stop), generator)

        def searcher(
            parts: Sequence[Part], terms: Optional[Sequence[Sequence[TokenTerm]]] = None
        ) -> list[list[Hypothesis]]:
            src = padded_sources([list(part.ids) for part in parts]).to(device)
            glued = None
            if terms is not None:  # a glossary: what may not follow a term is each output language's
                glued = [self._word_continuations(part.target or self.config.data.tgt_lang) for part in parts]
            return search.by_prefix_length(src, [part.prefix for part in parts], terms, glued)

        return searcher

    def attention(self, part: Part, tokens: Sequence[int]):
        """(AttentionMaps, source pieces, target pieces): one model's attention as it wrote `tokens`."""
        if len(self.models) != 1:
            raise ValueError("attention is one model's, not an ensemble's")
        maps = collect_attention(self.models[0], [*part.ids, EOS_ID], list(tokens))
        return (
            maps,
            self.tokenizers.source.id_to_piece(list(part.ids)),
            self.tokenizers.target.id_to_piece(list(tokens)),
        )


class _Search:
    """The configured search over batches of source ids."""

    def __init__(self, model, options: DecodeConfig, settings: SearchSettings, generator):
        self.model, self.options, self.settings, self.generator = model, options, settings, generator

    def by_prefix_length(
        self,
        src: torch.Tensor,
        prefixes: Sequence[Sequence[int]],
        terms: Optional[Sequence[Sequence[TokenTerm]]],
        glued: Optional[Sequence[frozenset[int]]] = None,
    ) -> list[list[Hypothesis]]:
        """The search over one batch (B, S), each row's output forced to begin with its prefix ids;
        with `terms`, each row's word continuations (`glued`, see `constrained_beam_search`).

        Rows whose prefixes differ in length are searched apart, one group per length: a search fills
        the cache with BOS and the prefix in one call and then moves every row one position per step,
        so its rows must stand at the same position. A group is exactly what its rows would be alone."""
        if not any(prefixes):
            return self.rows(src, None, terms, glued)
        results: list[list[Hypothesis]] = [[] for _ in prefixes]
        by_length = sorted(range(len(prefixes)), key=lambda row: len(prefixes[row]))
        for length, group in groupby(by_length, key=lambda row: len(prefixes[row])):
            rows = list(group)
            group_src = src[torch.tensor(rows, device=src.device)]
            group_src = group_src[:, : int((group_src != PAD_ID).sum(dim=1).max())]  # no column of padding alone
            prefix = torch.tensor([list(prefixes[row]) for row in rows], dtype=torch.long, device=src.device)
            group_terms = None if terms is None else [terms[row] for row in rows]
            group_glued = None if glued is None else [glued[row] for row in rows]
            found = self.rows(group_src, prefix.view(len(rows), length), group_terms, group_glued)
            for row, hypotheses in zip(rows, found):
                results[row] = hypotheses
        return results

    def rows(
        self,
        src: torch.Tensor,
        prefix: Optional[torch.Tensor],
        terms: Optional[Sequence[Sequence[TokenTerm]]],
        glued: Optional[Sequence[frozenset[int]]] = None,
    ) -> list[list[Hypothesis]]:
        """Sampling, greedy (beam 1), beam or constrained beam search over (B, S), as the options say."""
        options, settings = self.options, self.settings
        if terms is not None:
            return constrained_beam_search(self.model, src, terms, settings, prefix, glued or ())
        if options.sample:
            choose = sampler(options.temperature, options.top_k, options.top_p, self.generator)
            samples = greedy_search(self.model, src, settings, prefix, choose=choose)
            return [sorted(hypotheses, key=lambda h: h.score, reverse=True) for hypotheses in samples]  # best first
        if options.beam_size == 1:
            return greedy_search(self.model, src, settings, prefix)
        return beam_search(self.model, src, settings, prefix)
