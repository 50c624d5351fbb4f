"""Build the long-sentence sets kept in benchmarks/en-zh-long/: held-out pairs of more than 15 words.

Tatoeba's sentences are short: of the default config's 1,001 test pairs only a handful have more
than 15 source words. The long sets hold those, plus held-out pairs joined into longer ones:
the held-out pairs not already long, shuffled (seeded), are taken in turn and joined (sources with
a space, targets with the target language's separator: none for Chinese) until the source has more
than 15 words, each pair used once. The validation split gives `long-valid.*` (for choosing
decoding settings), the test split `long-test.*` (for reporting). The script checks that no
sentence of either set is a training source, so neither overlaps the training data.

    python3 -m tools.build_long_set --out benchmarks/en-zh-long       # from the repository root
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
from pathlib import Path

from attn_cli.config import load_config
from attn_cli.data.builtin_corpora import BUILTIN_PREFIX, corpus_file
from attn_cli.data.split import split_corpus
from attn_cli.decoding.by_length import BUCKET_BOUNDS
from attn_cli.languages import joiner as separator

LONG_WORDS = BUCKET_BOUNDS[-1]  # more than this many source words is long: attn eval --by-length's last bucket


def words(text: str) -> int:
    return len(text.split())


def long_groups(pairs: list[tuple[str, str]], seed: int) -> tuple[list[list[tuple[str, str]]], int]:
    """The pairs already long, each alone, then the others in groups joined until long; and how
    many were already long."""
    natural = [[pair] for pair in pairs if words(pair[0]) > LONG_WORDS]
    rest = [pair for pair in pairs if words(pair[0]) <= LONG_WORDS]
    random.Random(seed).shuffle(rest)
    joined, parts = [], []
    for pair in rest:
        parts.append(pair)
        if sum(words(source) for source, _ in parts) > LONG_WORDS:
            joined.append(parts)
            parts = []
    return natural + joined, len(natural)  # a last group that stayed short is left out


def attributions(corpus_path: str) -> dict[tuple[str, str], str]:
    """The third field (Tatoeba sentence ids and authors) of each pair of a tab-separated corpus."""
    path = corpus_file(corpus_path) if corpus_path.startswith(BUILTIN_PREFIX) else corpus_path
    opener = lzma.open if str(path).endswith(".xz") else open
    found = {}
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 3:
                found[(fields[0].strip(), fields[1].strip())] = fields[2]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="en-zh.yaml")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/en-zh-long"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cfg = load_config(args.config)
    split = split_corpus(cfg.data)
    training_sources = {source.strip() for source, _ in split.train_pairs()}
    source_separator, target_separator = separator(cfg.data.src_lang), separator(cfg.data.tgt_lang)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, held_out in (("valid", split.valid), ("test", split.test)):
        overlap = [source for source, _ in held_out if source.strip() in training_sources]
        if overlap:
            raise SystemExit(f"{len(overlap)} held-out {name} sources are also training sources, e.g. {overlap[0]!r}")
        groups, natural = long_groups(held_out, args.seed)
        made = [
            (source_separator.join(s for s, _ in group), target_separator.join(t for _, t in group)) for group in groups
        ]
        for side, lang in ((0, cfg.data.src_lang), (1, cfg.data.tgt_lang)):
            (args.out / f"long-{name}.{lang}").write_text("".join(pair[side] + "\n" for pair in made), encoding="utf-8")
        credits = attributions(cfg.data.corpus.path)  # CC-BY: each line keeps the credit of its sentences
        (args.out / f"long-{name}.attribution").write_text(
            "".join(" + ".join(credits.get((s.strip(), t.strip()), "?") for s, t in group) + "\n" for group in groups),
            encoding="utf-8",
        )
        lengths = sorted(words(source) for source, _ in made)
        summary[name] = {
            "pairs": len(made),
            "single_sentences": natural,
            "joined": len(made) - natural,
            "held_out_pairs": len(held_out),
            "median_words": lengths[len(lengths) // 2],
            "max_words": lengths[-1],
        }
        print(
            f"{name}: {len(made)} pairs ({natural} held-out sentences of more than {LONG_WORDS} words, "
            f"{len(made) - natural} joined), median {lengths[len(lengths) // 2]} words, longest {lengths[-1]}"
        )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
