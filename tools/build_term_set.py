"""Build the terminology set kept in benchmarks/en-zh-terms/: a glossary and the held-out test
pairs it applies to, for measuring term accuracy (`attn eval --glossary`).

Everything comes from the held-out splits of the default config, which share no source with the
training pairs (checked again here):

1. Terms. Over the validation and test pairs together (a source translated twice counted once), an
   English word is a candidate in at least `--min-count` sources (stop words left out). Its
   targets are Chinese strings of 1 to 4 characters that the references of those sources hold,
   found greedily (the most frequent first, then the most frequent in the references it misses, up
   to three alternatives), each specific to the word (at least `--min-specific` of the references
   that hold it come from sources with the word) and frequent with it (the first in half of its
   references, each other in a quarter, every one in at least two); of strings held equally
   often, the one most often made of whole words as the default run's target tokenizer (trained on
   training text only) cuts them, so 早上 rather than 天早上, and never a string that is mostly
   part of a longer word (波 of 波士顿). The word is kept when its
   targets cover at least `--min-share` of its references: it is rendered so, consistently.
   A few targets were then corrected or dropped by hand (CORRECTED, DROPPED below).
2. Sentences. The test pairs that at least one term applies to (as `attn eval --glossary` decides:
   case aside, on word boundaries, longest first), kept when the reference holds the target of
   every term that applies, so that the glossary never asks for what the reference does not say.

    python3 -m tools.build_term_set --run runs/en-zh --out benchmarks/en-zh-terms   # from the repository root
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from attn_cli.config import load_config
from attn_cli.data.split import split_corpus
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.decoding.glossary import Term, applicable_terms, occurs
from tools.build_long_set import attributions

STOP_WORDS = set(
    """a an the and or but if of to in on at by for with from as is are was were be been being am do does did
    done have has had having i me my mine you your yours he him his she her hers it its we us our ours they them
    their theirs this that these those there here what which who whom whose when where why how not no yes so
    very too can could will would shall should may might must all any some one two each every than then
    also just only up down out off over about into onto again more most much many such own same other another
    something anything nothing everything someone anyone everyone never ever always still yet already""".split()
)
# Reviewed by hand after the counts: targets that are a fragment of the word's rendering become the
# whole word, and words whose strings are not a rendering of them (a neighbour's, or two senses)
# are dropped.
CORRECTED = {"Boston": ("波士顿",), "boy": ("男孩",), "friends": ("朋友",), "interesting": ("有趣", "有意思")}
DROPPED = {"stayed", "high", "alone"}
_WORD = re.compile(r"[A-Za-z]+")
_HAN_RUN = re.compile(r"[\u3400-\u9fff]+")


def source_words(source: str) -> set[str]:
    return {word.lower() for word in _WORD.findall(source) if len(word) > 1} - STOP_WORDS


def target_strings(reference: str, segment, longest: int = 4) -> dict[str, bool]:
    """Each string of 1 to `longest` Chinese characters in the reference, and whether it is made of
    whole words there: it begins and ends where `segment` (the run's target tokenizer) cuts."""
    pieces = [piece.replace("\u2581", "") for piece in segment(reference)]
    text = "".join(pieces)
    cuts, at = {0}, 0
    for piece in pieces:
        at += len(piece)
        cuts.add(at)
    found: dict[str, bool] = {}
    for start in range(len(text)):
        for size in range(1, longest + 1):
            string = text[start : start + size]
            if len(string) == size and _HAN_RUN.fullmatch(string):
                found[string] = found.get(string, False) or (start in cuts and start + size in cuts)
    return found


def _best_string(indices, strings, global_counts: Counter, min_specific: float, least: int, whole: Counter, size: int):
    """The string of at least `size` characters that most of the sentences `indices` hold, among
    those held by at least `least` of them and specific to them (None if there is none). Of strings
    held equally often, one that is a whole word somewhere (澳大利亚, not 大利), then the shortest
    (故事, not 的故事; 早上, not 天早上)."""
    counts = Counter(string for index in indices for string in strings[index] if len(string) >= size)
    counts = Counter({s: c for s, c in counts.items() if c >= least and c / global_counts[s] >= min_specific})
    if not counts:
        return None
    return min(counts, key=lambda s: (-counts[s], whole[s] == 0, len(s), -global_counts[s], s))


def unambiguous_terms(pairs, segment, min_count: int, min_share: float, min_specific: float) -> list[tuple[Term, dict]]:
    """Each word's targets: the strings found one after another (each for the sentences the ones
    before leave uncovered, up to three alternatives, as 英语 and 英文 for "English") until they
    cover `min_share` of the word's sources."""
    with_word: dict[str, list[int]] = defaultdict(list)
    global_counts: Counter = Counter()
    whole: Counter = Counter()  # how many references hold each string as whole words
    strings, unique_sources = [], []
    for source, reference in pairs:
        if source in unique_sources:  # a source translated twice counts once
            continue
        unique_sources.append(source)
        for word in source_words(source):
            with_word[word].append(len(strings))
        found = target_strings(reference, segment)
        strings.append(set(found))
        global_counts.update(found.keys())
        whole.update(string for string, aligned in found.items() if aligned)
    terms = []
    for word, indices in sorted(with_word.items()):
        if len(indices) < min_count:
            continue
        # Words of two characters or more first: a single character is taken only for a word that
        # they do not cover (猫 for "cat", not 波 for "Boston").
        for size in (2, 1):
            targets, left = [], list(indices)
            while left and len(targets) < 3 and 1 - len(left) / len(indices) < min_share:
                # The first target renders the word in half its sources, each other in an eighth, all in two.
                least = max(2, -(-len(indices) // 8), -(-len(indices) // 2) if not targets else 0)
                string = _best_string(left, strings, global_counts, min_specific, least, whole, size)
                if string is None:
                    break
                targets.append(string)
                left = [index for index in left if string not in strings[index]]
            share = 1 - len(left) / len(indices)
            if share >= min_share:
                break
        if share < min_share:
            continue
        spelled = Counter(m for index in indices for m in _WORD.findall(unique_sources[index]) if m.lower() == word)
        stats = {"sources": len(indices), "share": round(share, 3)}
        terms.append((Term(spelled.most_common(1)[0][0], tuple(targets)), stats))
    return terms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="en-zh.yaml")
    parser.add_argument("--run", type=Path, default=Path("runs/en-zh"), help="its target tokenizer cuts words")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/en-zh-terms"))
    parser.add_argument("--min-count", type=int, default=4)
    parser.add_argument("--min-share", type=float, default=0.9)
    parser.add_argument("--min-specific", type=float, default=0.5)
    args = parser.parse_args()
    cfg = load_config(args.config)
    split = split_corpus(cfg.data)
    training_sources = {source.strip() for source, _ in split.train_pairs()}
    held_out = [(s.strip(), t.strip()) for s, t in [*split.valid, *split.test]]
    overlap = [source for source, _ in held_out if source in training_sources]
    if overlap:
        raise SystemExit(f"{len(overlap)} held-out sources are also training sources, e.g. {overlap[0]!r}")
    target = Tokenizers.load(args.run / "tokenizer").target
    segment = lambda text: target.encode_pieces([text])[0]  # noqa: E731
    found = [
        (Term(term.source, CORRECTED.get(term.source, term.targets)), stats)
        for term, stats in unambiguous_terms(held_out, segment, args.min_count, args.min_share, args.min_specific)
        if term.source not in DROPPED
    ]
    terms = [term for term, _ in found]
    src_lang, tgt_lang = cfg.data.src_lang, cfg.data.tgt_lang
    kept, used = [], Counter()
    for source, reference in ((s.strip(), t.strip()) for s, t in split.test):
        applied = applicable_terms(source, terms, src_lang)
        if applied and all(any(occurs(reference, t, tgt_lang) for t in term.targets) for term in applied):
            kept.append((source, reference))
            used.update(term.source for term in applied)
    glossary = [(term, stats) for term, stats in found if used[term.source]]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "glossary.tsv").write_text(
        "# source term<TAB>target term: unambiguous in the held-out splits (tools/build_term_set.py)\n"
        + "".join(f"{term.source}\t" + "\t".join(term.targets) + "\n" for term, _ in glossary),
        encoding="utf-8",
    )
    for side, lang in ((0, src_lang), (1, tgt_lang)):
        (args.out / f"test.{lang}").write_text("".join(pair[side] + "\n" for pair in kept), encoding="utf-8")
    credits = attributions(cfg.data.corpus.path)  # CC-BY: each line keeps the credit of its sentences
    (args.out / "test.attribution").write_text(
        "".join(credits.get(pair, "?") + "\n" for pair in kept), encoding="utf-8"
    )
    summary = {
        "terms": len(glossary),
        "sentences": len(kept),
        "term_occurrences": sum(used.values()),
        "held_out_pairs": len(held_out),
        "test_pairs": len(split.test),
        "settings": {"min_count": args.min_count, "min_share": args.min_share, "min_specific": args.min_specific},
        "corrected_by_hand": sorted(CORRECTED),
        "dropped_by_hand": sorted(DROPPED),
        "per_term": {term.source: {**stats, "test_sentences": used[term.source]} for term, stats in glossary},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(
        f"{len(glossary)} terms applied {sum(used.values())} times in {len(kept)} of {len(split.test)} test pairs "
        f"(terms found in {len(held_out)} held-out pairs)"
    )


if __name__ == "__main__":
    main()
