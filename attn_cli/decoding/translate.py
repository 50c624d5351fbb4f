"""From strings to translations: tokenize, fit long inputs to the model, batch by length, decode
with the configured search (from a forced prefix, when given), detokenize, and give the results
back in input order.

Training's validation BLEU, `attn translate` and `attn eval` all come through here, so they all
decode the same way, with the `decode` section of the config.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Optional

import torch

from attn_cli import languages
from attn_cli.config import DecodeConfig
from attn_cli.data.batching import Example, collate, token_batches
from attn_cli.data.tokenizer import Tokenizer, Tokenizers
from attn_cli.decoding import glossary
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.constrained import TokenTerm, constrained_beam_search
from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.greedy import greedy_search, sampler
from attn_cli.decoding.hypothesis import Hypothesis, OutputConstraint
from attn_cli.decoding.stutter import NoStutter
from attn_cli.decoding.utf8 import Utf8Constraint
from attn_cli.errors import UserError
from attn_cli.model import Transformer
from attn_cli.vocab import PAD_ID

# Where a long input may be cut: after a piece that ends a sentence or a clause.
_BOUNDARY_ENDINGS = tuple(".!?;:,。！？；：，")


@dataclass
class Translation:
    source: str
    texts: list[str]  # the n-best translations, best first
    scores: list[float]  # their length-normalised log-probabilities
    tokens: list[list[str]]  # their target pieces
    parts: list[list[int]] = field(default_factory=list)  # source ids the model saw, no EOS; a long input has several
    outputs: list[list[Hypothesis]] = field(default_factory=list)  # per part, best first
    note: str = ""  # what was done to an input longer than the model takes, or a term not met
    prefix: str = ""  # the target text every translation was forced to begin with
    terms: list[str] = field(default_factory=list)  # the glossary's source terms that applied
    unmet_terms: list[str] = field(default_factory=list)  # of them, those the best translation lacks
    # The best translation of the search without the glossary: what the input gives with no glossary.
    unconstrained: str = ""


def decode_batch(
    model: Transformer | Ensemble,
    src: torch.Tensor,
    options: DecodeConfig,
    generator: torch.Generator | None = None,
    prefixes: Optional[Sequence[Sequence[int]]] = None,
    constraints: Sequence[OutputConstraint] = (),
    terms: Optional[Sequence[Sequence[TokenTerm]]] = None,
    word_continuations: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    """The configured search over one batch (B, S): sampling, greedy (beam 1) or beam search, each
    row's output forced to begin with its `prefixes` ids (none: no prefix). With `terms`, one list
    per row, the beam search is constrained to write each row's terms (decoding/constrained.py,
    where `word_continuations` is explained); a row it could not place them in gets no hypothesis.

    Rows whose prefixes differ in length are searched apart, one group per length: a search fills
    the cache with BOS and the prefix in one call and then moves every row one position per step,
    so its rows must stand at the same position. A group is exactly what its rows would be alone.
    `constraints` (see `output_constraints`) rule out tokens at every step of the search."""
    if prefixes is None or not any(prefixes):
        return _search(model, src, options, generator, None, constraints, terms, word_continuations)
    results: list[list[Hypothesis]] = [[] for _ in prefixes]
    by_length = sorted(range(len(prefixes)), key=lambda row: len(prefixes[row]))
    for length, group in groupby(by_length, key=lambda row: len(prefixes[row])):
        rows = list(group)
        group_src = src[torch.tensor(rows, device=src.device)]
        group_src = group_src[:, : int((group_src != PAD_ID).sum(dim=1).max())]  # no column of padding alone
        prefix = torch.tensor([list(prefixes[row]) for row in rows], dtype=torch.long, device=src.device)
        group_terms = None if terms is None else [terms[row] for row in rows]
        found = _search(
            model,
            group_src,
            options,
            generator,
            prefix.view(len(rows), length),
            constraints,
            group_terms,
            word_continuations,
        )
        for row, hypotheses in zip(rows, found):
            results[row] = hypotheses
    return results


def _search(
    model: Transformer | Ensemble,
    src: torch.Tensor,
    options: DecodeConfig,
    generator: torch.Generator | None,
    prefix: Optional[torch.Tensor],
    constraints: Sequence[OutputConstraint] = (),
    terms: Optional[Sequence[Sequence[TokenTerm]]] = None,
    word_continuations: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    beam = (options.beam_size, options.length_penalty, options.max_len_a, options.max_len_b, options.n_best)
    rules = dict(prefix=prefix, no_repeat_ngram=options.no_repeat_ngram, constraints=constraints)
    if terms is not None:
        require_beam_for_terms(options)
        return constrained_beam_search(model, src, terms, *beam, **rules, word_continuations=word_continuations)
    if options.sample:
        choose = sampler(options.temperature, options.top_k, options.top_p, generator)
        samples = greedy_search(
            model,
            src,
            options.max_len_a,
            options.max_len_b,
            choose=choose,
            samples=options.n_best,
            alpha=options.length_penalty,
            prefix=prefix,
            no_repeat_ngram=options.no_repeat_ngram,
            constraints=constraints,
        )
        return [sorted(hypotheses, key=lambda h: h.score, reverse=True) for hypotheses in samples]  # best first
    if options.beam_size == 1:
        return greedy_search(
            model,
            src,
            options.max_len_a,
            options.max_len_b,
            alpha=options.length_penalty,
            prefix=prefix,
            no_repeat_ngram=options.no_repeat_ngram,
            constraints=constraints,
        )
    return beam_search(model, src, *beam, **rules)


def places_terms(options: DecodeConfig) -> bool:
    """Whether the configured search can place a glossary's terms: the beam search alone can, for
    greedy search and sampling keep one hypothesis a step, with no room for one writing a term."""
    return not options.sample and options.beam_size >= 2


def require_beam_for_terms(options: DecodeConfig) -> None:
    """A UserError, in the command line's words, when the configured search cannot place terms."""
    if not places_terms(options):
        how = "sampling" if options.sample else "greedy search (beam 1)"
        raise UserError(
            f"a glossary needs beam search, and {how} cannot place terms; use --beam 2 or more (5 is usual)"
            + (" without --sample" if options.sample else "")
        )


def output_constraints(target: Tokenizer, options: DecodeConfig) -> list[OutputConstraint]:
    """What every output of attn's own search keeps to: valid UTF-8 when the target tokenizer has
    byte pieces (no output decodes to U+FFFD), and no stutter when `decode.no_stutter` asks."""
    return list(_constraints_of(target, options.no_stutter))


@functools.lru_cache(maxsize=8)
def _constraints_of(target: Tokenizer, no_stutter: bool) -> tuple[OutputConstraint, ...]:
    """Built once per tokenizer and reused by every call: indexing a whole vocabulary takes longer
    than decoding a short sentence, and a server calls the search once per batch of requests. The
    constraints keep no state between searches."""
    constraints: list[OutputConstraint] = []
    valid_utf8 = Utf8Constraint.for_tokenizer(target)
    if valid_utf8 is not None:
        constraints.append(valid_utf8)
    if no_stutter:
        constraints.append(NoStutter.for_tokenizer(target))
    return tuple(constraints)


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


def translate_sentences(
    model: Transformer | Ensemble | None,
    tokenizers: Tokenizers,
    sentences: Sequence[str],
    options: DecodeConfig,
    max_source_tokens: int,
    target_language: str = "",
    on_batch: Callable[[int, int], None] | None = None,
    search: Search | None = None,
    prefixes: Optional[Sequence[str]] = None,
    glossaries: Optional[Sequence[Sequence[glossary.Term]]] = None,
    source_language: str = "",
) -> list[Translation]:
    """Translate strings in length-sorted token-budget batches; results come back in input order.

    `model` is one model or an `Ensemble`. An input of more than `max_source_tokens` tokens is split
    or truncated as `options.long_inputs` says, with a note. An empty (or all-whitespace) line
    translates to an empty line. After each batch, `on_batch(done, total)` is told how many of the
    parts to translate are done. `search` decodes the batches instead of `model`'s own search (an
    exported model, attn_cli.export); it takes no prefixes and no glossary. `prefixes`, one per
    sentence ("" for none), is target text each translation must begin with: encoded with the target
    tokenizer (no EOS), it forces the start of the first part of its input.

    `glossaries`, one list of terms per sentence, are terms each translation must use where their
    source side occurs (in `source_language`; decoding/glossary.py). Every part is searched as
    without them first; a part whose outputs lack one of its terms is searched again, constrained to
    write them (decoding/constrained.py). So an output that already holds its terms stays as it was,
    and the slower constrained search runs only where it changes something. A part whose terms
    cannot be placed keeps its first output, and its translation names the terms it lacks.
    """
    prefix_ids = _encode_prefixes(model, tokenizers, prefixes, len(sentences))
    with_glossary = glossaries is not None and any(glossaries)
    if with_glossary and len(glossaries) != len(sentences):
        raise ValueError(f"{len(glossaries)} glossaries for {len(sentences)} sentences; give one per sentence")
    if search is None:
        device = Ensemble.of(model).device
        generator = torch.Generator(device=device).manual_seed(options.seed) if options.seed is not None else None
        constraints = output_constraints(tokenizers.target, options)
        if with_glossary:
            require_beam_for_terms(options)

        continuations = glossary.word_continuations(tokenizers.target, target_language) if with_glossary else ()

        def search(src, prefixes=None, terms=None):
            return decode_batch(model, src, options, generator, prefixes, constraints, terms, continuations)
    elif any(prefix_ids) or with_glossary:
        raise ValueError("prefixes and glossaries need attn's own search; an exported model's `search` takes neither")
    else:
        device = torch.device("cpu")
    plain = tokenizers.source.encode([s.strip() for s in sentences])
    encoded = tokenizers.prefixed(plain)
    # A long input is cut without its source prefix, and every part gets the prefix: a multi-target
    # model needs it at the start of each source it translates.
    room = max_source_tokens - len(tokenizers.prefix_ids)
    plain_parts = [fit_to_length(ids, room, options.long_inputs, tokenizers.source.id_to_piece) for ids in plain]
    parts = [tokenizers.prefixed(input_parts) for input_parts in plain_parts]
    # Every non-empty part of every input is one example; `owners` maps it back to its input. The
    # prefix begins the input's translation, so it forces the first part's output only.
    owned = [
        (owner, number, part, prefix_ids[owner] if number == 0 else [])
        for owner, input_parts in enumerate(parts)
        for number, part in enumerate(input_parts)
        if part
    ]
    owners = [owner for owner, _, _, _ in owned]
    examples = [Example(index, part, []) for index, (_, _, part, _) in enumerate(owned)]
    example_prefixes = [prefix for _, _, _, prefix in owned]
    part_terms: list[list[glossary.Term]] = [[] for _ in examples]
    if with_glossary:
        for index, (owner, number, _, _) in enumerate(owned):
            whole = len(plain_parts[owner]) == 1 and len(plain_parts[owner][0]) == len(plain[owner])
            text = sentences[owner] if whole else tokenizers.source.decode([plain_parts[owner][number]])[0]
            part_terms[index] = glossary.applicable_terms(text, glossaries[owner], source_language)
    # The total counts every part with a term twice, until the first search says which need another.
    progress = _Progress(on_batch, len(examples) + sum(map(bool, part_terms)))

    def decode(batch):
        batch_prefixes = [example_prefixes[index] for index in batch.indices]
        return search(batch.src, batch_prefixes) if any(batch_prefixes) else search(batch.src)

    outputs = _decode_examples(examples, options.max_tokens, device, decode, progress)
    first_outputs = list(outputs)
    again = [
        index
        for index, terms in enumerate(part_terms)
        if terms and not all(_holds_terms(text, terms, target_language) for text in _texts(outputs[index], tokenizers))
    ]
    progress.total = len(examples) + len(again)
    if again:
        found = _search_with_terms(
            [examples[index] for index in again],
            [example_prefixes[i] for i in again],
            [part_terms[i] for i in again],
            search,
            tokenizers,
            target_language,
            options.max_tokens,
            device,
            progress,
        )
        for index, hypotheses in zip(again, found):
            outputs[index] = _with_terms_first(
                outputs[index], hypotheses, part_terms[index], tokenizers, target_language, options.n_best
            )

    per_input: list[list[list[Hypothesis]]] = [[] for _ in sentences]
    first_per_input: list[list[Hypothesis]] = [[] for _ in sentences]
    terms_per_input: list[list[glossary.Term]] = [[] for _ in sentences]
    for index, owner in enumerate(owners):
        per_input[owner].append(outputs[index])
        first_per_input[owner].append(first_outputs[index][0] if first_outputs[index] else Hypothesis([], 0.0, 0.0))
        terms_per_input[owner] += [term for term in part_terms[index] if term not in terms_per_input[owner]]
    joiner = languages.joiner(target_language)  # between the parts of a split input
    prefixes = prefixes or [""] * len(sentences)
    translations = [
        _assemble(sentence, ids, part_ids, part_outputs, tokenizers, joiner, options.n_best, prefix)
        for sentence, ids, part_ids, part_outputs, prefix in zip(sentences, encoded, parts, per_input, prefixes)
    ]
    for translation, firsts, terms in zip(translations, first_per_input, terms_per_input):
        translation.unconstrained = joiner.join(tokenizers.target.decode([h.tokens for h in firsts])) if firsts else ""
        _note_terms(translation, terms, target_language)
    return translations


@dataclass
class _Progress:
    """`on_batch` told of the parts decoded so far, over both searches of a glossary."""

    on_batch: Callable[[int, int], None] | None
    total: int
    done: int = 0

    def advance(self, count: int) -> None:
        self.done += count
        if self.on_batch is not None:
            self.on_batch(self.done, self.total)


def _decode_examples(
    examples: Sequence[Example],
    max_tokens: int,
    device: torch.device,
    decode: Callable[..., list[list[Hypothesis]]],
    progress: _Progress,
) -> list[list[Hypothesis]]:
    """Each example's hypotheses, decoded in length-sorted token-budget batches by `decode(batch)`."""
    outputs: list[list[Hypothesis]] = [[] for _ in examples]
    for positions in token_batches(examples, max_tokens, shuffle=False):
        batch = collate([examples[p] for p in positions]).to(device)
        for index, hypotheses in zip(batch.indices, decode(batch)):
            outputs[index] = hypotheses
        progress.advance(len(positions))
    return outputs


def _search_with_terms(
    examples: Sequence[Example],
    prefixes: Sequence[list[int]],
    terms: Sequence[Sequence[glossary.Term]],
    search: Callable[..., list[list[Hypothesis]]],
    tokenizers: Tokenizers,
    target_language: str,
    max_tokens: int,
    device: torch.device,
    progress: _Progress,
) -> list[list[Hypothesis]]:
    """Each example searched again, constrained to write its terms (a term the target vocabulary
    cannot write is left to the check that names unmet terms)."""
    token_terms = [
        [
            found
            for term in example_terms
            if (found := glossary.token_alternatives(term, tokenizers.target, target_language))
        ]
        for example_terms in terms
    ]
    numbered = [Example(number, example.src, []) for number, example in enumerate(examples)]

    def decode(batch):
        return search(batch.src, [prefixes[n] for n in batch.indices], [token_terms[n] for n in batch.indices])

    return _decode_examples(numbered, max_tokens, device, decode, progress)


def _with_terms_first(
    first: list[Hypothesis],
    again: list[Hypothesis],
    terms: Sequence[glossary.Term],
    tokenizers: Tokenizers,
    target_language: str,
    n_best: int,
) -> list[Hypothesis]:
    """A part's n-best from its two searches: the first search's best when it holds every term
    (a best translation that follows the glossary stays the best), then every other output that
    holds them, best score first, then, only to fill the list, the outputs that lack some."""
    unique = {tuple(h.tokens): h for h in [*again, *first]}  # an output both found: the first search's
    ranked = sorted(unique.values(), key=lambda h: h.score, reverse=True)
    holds = [_holds_terms(text, terms, target_language) for text in _texts(ranked, tokenizers)]
    holding = [h for h, ok in zip(ranked, holds) if ok]
    lacking = [h for h, ok in zip(ranked, holds) if not ok]
    if first and any(h is first[0] for h in holding):
        holding = [first[0], *(h for h in holding if h is not first[0])]
    return (holding + lacking)[:n_best]


def _note_terms(translation: Translation, terms: Sequence[glossary.Term], target_language: str) -> None:
    """Record on `translation` the terms that applied, and name in its note those it lacks."""
    translation.terms = [term.source for term in terms]
    translation.unmet_terms = [
        term.source for term in terms if not _holds_terms(translation.texts[0], [term], target_language)
    ]
    if translation.unmet_terms:
        named = ", ".join(repr(term) for term in translation.unmet_terms)
        unmet = (
            f"glossary terms not met ({named}): they do not fit within the output limit (--max-len-a, "
            f"--max-len-b), an output rule forbids them, or the target vocabulary cannot write them"
        )
        translation.note = f"{translation.note}; {unmet}" if translation.note else unmet


def _texts(hypotheses: Sequence[Hypothesis], tokenizers: Tokenizers) -> list[str]:
    return tokenizers.target.decode([h.tokens for h in hypotheses])


def _holds_terms(text: str, terms: Sequence[glossary.Term], language: str) -> bool:
    """Whether `text` holds one target of each of `terms`."""
    return all(any(glossary.occurs(text, target, language) for target in term.targets) for term in terms)


def _encode_prefixes(
    model: Transformer | Ensemble | None, tokenizers: Tokenizers, prefixes: Optional[Sequence[str]], count: int
) -> list[list[int]]:
    """The target ids of each input's prefix (no EOS: the output goes on after it); a prefix must
    leave the decoder a position to end in."""
    if prefixes is None:
        return [[] for _ in range(count)]
    if len(prefixes) != count:
        raise ValueError(f"{len(prefixes)} prefixes for {count} sentences; give one per sentence")
    ids = tokenizers.target.encode([prefix.strip() for prefix in prefixes])
    most = Ensemble.of(model).max_target_tokens if model is not None else None
    for prefix, prefix_ids in zip(prefixes, ids):
        if most is not None and len(prefix_ids) > most:  # the output begins with the prefix
            shown = prefix if len(prefix) <= 40 else prefix[:40] + "…"
            raise UserError(
                f"the prefix {shown!r} is {len(prefix_ids)} target tokens, more than the {most} "
                f"the model can output; shorten it"
            )
    return ids


def _assemble(
    sentence: str,
    ids: list[int],
    parts: list[list[int]],
    outputs: list[list[Hypothesis]],
    tokenizers: Tokenizers,
    joiner: str,
    n_best: int,
    prefix: str = "",
) -> Translation:
    """One input's translation from its parts' hypotheses: the i-th best of each part, joined."""
    if not outputs:  # an empty input: n empty translations, so n-best output keeps n lines per input
        return Translation(
            sentence, [""] * n_best, [0.0] * n_best, [[] for _ in range(n_best)], parts, outputs, prefix=prefix
        )
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
    return Translation(sentence, texts, scores, tokens, parts, outputs, note, prefix)
