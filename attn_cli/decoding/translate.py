"""From strings to translations: tokenize, fit long inputs to the model, batch by length, decode
with the configured search, detokenize, and give the results back in input order.

Training's validation BLEU, `attn translate` and `attn eval` all come through here, so they all
decode the same way, with the `decode` section of the config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attn_cli.decoding.beam import beam_search
from attn_cli.config import DecodeConfig
from attn_cli.data.batching import Example, collate, token_batches
from attn_cli.decoding.greedy import greedy_search, sampler
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.model import Transformer
from attn_cli.data.tokenizer import Tokenizers

# Where a long input may be cut: after a piece that ends a sentence or a clause.
_BOUNDARY_ENDINGS = tuple(".!?;:,。！？；：，")
# Languages written without spaces between words, where the parts of a split input join directly.
_UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "km", "my"}


@dataclass
class Translation:
    source: str
    texts: list[str]  # the n-best translations, best first
    scores: list[float]  # their length-normalised log-probabilities
    tokens: list[list[str]]  # their target pieces
    parts: list[list[int]] = field(default_factory=list)  # source ids the model saw, no EOS; a long input has several
    outputs: list[list[Hypothesis]] = field(default_factory=list)  # per part, best first
    note: str = ""  # what was done to an input longer than the model takes


def override_decode(decode: DecodeConfig, overrides: Mapping[str, Any]) -> DecodeConfig:
    """`decode` with the overrides that were given (None keeps the config's value), validated as the
    config's `decode` section: a ConfigError names the decode.* key at fault."""
    options = dataclasses.replace(decode, **{key: value for key, value in overrides.items() if value is not None})
    options.validate("decode")
    return options


def decode_batch(model: Transformer, src: torch.Tensor, options: DecodeConfig,
                 generator: torch.Generator | None = None) -> list[list[Hypothesis]]:
    """The configured search over one batch (B, S): sampling, greedy (beam 1) or beam search."""
    if options.sample:
        choose = sampler(options.temperature, options.top_k, options.top_p, generator)
        samples = greedy_search(model, src, options.max_len_a, options.max_len_b, choose=choose,
                                samples=options.n_best, alpha=options.length_penalty)
        return [sorted(hypotheses, key=lambda h: h.score, reverse=True) for hypotheses in samples]  # best first
    if options.beam_size == 1:
        return greedy_search(model, src, options.max_len_a, options.max_len_b, alpha=options.length_penalty)
    return beam_search(model, src, options.beam_size, options.length_penalty, options.max_len_a,
                       options.max_len_b, options.n_best)


def fit_to_length(ids: list[int], limit: int, mode: str, pieces: Callable[[list[int]], list[str]]) -> list[list[int]]:
    """An input of more than `limit` tokens, cut to fit: truncated, or split into parts at the last
    sentence or clause boundary of each window (at the window's end when it has none in its second half)."""
    if len(ids) <= limit:
        return [ids]
    if mode == "truncate":
        return [ids[:limit]]
    boundaries = {i + 1 for i, piece in enumerate(pieces(ids)) if piece.rstrip().endswith(_BOUNDARY_ENDINGS)}
    parts, start = [], 0
    while len(ids) - start > limit:
        # max(1, ...): with limit 1, a boundary at `start` itself would cut an empty part, forever.
        cut = max((b for b in boundaries if start + max(1, limit // 2) <= b <= start + limit), default=start + limit)
        parts.append(ids[start:cut])
        start = cut
    parts.append(ids[start:])
    return parts


Search = Callable[[torch.Tensor], list[list[Hypothesis]]]  # (B, S) source ids -> each row's hypotheses, best first


def translate_sentences(model: Transformer | None, tokenizers: Tokenizers, sentences: Sequence[str], options: DecodeConfig,
                        max_source_tokens: int, target_language: str = "",
                        on_batch: Callable[[int, int], None] | None = None, search: Search | None = None) -> list[Translation]:
    """Translate strings in length-sorted token-budget batches; results come back in input order.

    An input of more than `max_source_tokens` tokens is split or truncated as `options.long_inputs`
    says, with a note. An empty (or all-whitespace) line translates to an empty line. After each
    batch, `on_batch(done, total)` is told how many of the parts to translate are done. `search`
    decodes the batches instead of `model`'s own search (an exported model, attn_cli.export).
    """
    if search is None:
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(options.seed) if options.seed is not None else None
        search = lambda src: decode_batch(model, src, options, generator)  # noqa: E731
    else:
        device = torch.device("cpu")
    encoded = tokenizers.source.encode([s.strip() for s in sentences])
    parts = [fit_to_length(ids, max_source_tokens, options.long_inputs, tokenizers.source.id_to_piece)
             for ids in encoded]
    # Every non-empty part of every input is one example; `owners` maps it back to its input.
    owned = [(owner, part) for owner, input_parts in enumerate(parts) for part in input_parts if part]
    owners = [owner for owner, _ in owned]
    examples = [Example(index, part, []) for index, (_, part) in enumerate(owned)]
    outputs: list[list[Hypothesis]] = [[] for _ in examples]
    done = 0
    for positions in token_batches(examples, options.max_tokens, shuffle=False):
        batch = collate([examples[p] for p in positions]).to(device)
        for index, hypotheses in zip(batch.indices, search(batch.src)):
            outputs[index] = hypotheses
        done += len(positions)
        if on_batch is not None:
            on_batch(done, len(examples))

    per_input: list[list[list[Hypothesis]]] = [[] for _ in sentences]
    for owner, hypotheses in zip(owners, outputs):
        per_input[owner].append(hypotheses)
    joiner = "" if target_language in _UNSPACED_LANGUAGES else " "
    return [_assemble(sentence, ids, part_ids, part_outputs, tokenizers, joiner, options.n_best)
            for sentence, ids, part_ids, part_outputs in zip(sentences, encoded, parts, per_input)]


def _assemble(sentence: str, ids: list[int], parts: list[list[int]], outputs: list[list[Hypothesis]],
              tokenizers: Tokenizers, joiner: str, n_best: int) -> Translation:
    """One input's translation from its parts' hypotheses: the i-th best of each part, joined."""
    if not outputs:  # an empty input: n empty translations, so n-best output keeps n lines per input
        return Translation(sentence, [""] * n_best, [0.0] * n_best, [[] for _ in range(n_best)], parts, outputs)
    texts, scores, tokens = [], [], []
    for rank in range(min(len(hypotheses) for hypotheses in outputs)):
        chosen = [hypotheses[rank] for hypotheses in outputs]
        texts.append(joiner.join(tokenizers.target.decode([h.tokens for h in chosen])))
        scores.append(sum(h.score for h in chosen))
        tokens.append([piece for h in chosen for piece in tokenizers.target.id_to_piece(h.tokens)])
    note = ""
    if len(parts) > 1:
        note = f"{len(ids)} tokens is more than the model takes; translated in {len(parts)} parts"
    elif len(parts[0]) < len(ids):
        note = f"{len(ids)} tokens is more than the model takes; truncated to the first {len(parts[0])}"
    return Translation(sentence, texts, scores, tokens, parts, outputs, note)
