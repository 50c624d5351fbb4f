"""Glossary-constrained translation on the kept terminology set: term accuracy, BLEU and time.

Decodes benchmarks/en-zh-terms/test.en (built by scripts/build_term_set.py from held-out pairs)
with a run's best checkpoint at the config's beam (5 for en-zh.yaml), without and with the
glossary, alternating `--repeats` times, and reports for each: term accuracy (the exact-match
share of WMT's terminology tasks), BLEU and chrF against the references, and the median decoding
time. The same scores are given for the sentences whose terms the model misses without the
glossary. One more row times the constrained search alone on every sentence with a term (what
`attn translate --glossary` would cost if it did not keep the outputs that already hold their
terms), for the design's sake.

    python3 scripts/bench_glossary.py --run runs/en-zh --json bench_results/glossary.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from attn_cli.checkpoint import find_checkpoint, load_checkpoint
from attn_cli.data.batching import Example, collate, token_batches
from attn_cli.decoding.constrained import constrained_beam_search
from attn_cli.decoding.glossary import applicable_terms, read_glossary, term_accuracy, token_alternatives
from attn_cli.decoding.io import read_parallel
from attn_cli.decoding.scoring import score_translations
from attn_cli.decoding.translate import output_constraints, translate_sentences


def scores(sources, hypotheses, references, terms, src_lang, tgt_lang) -> dict:
    bleu, chrf = score_translations(hypotheses, references, tgt_lang)
    accuracy = term_accuracy(sources, hypotheses, terms, src_lang, tgt_lang)
    return {
        "sentences": len(sources),
        "terms": accuracy.applied,
        "term_accuracy": round(100 * accuracy.share, 2),
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
    }


def constrained_everywhere(checkpoint, sentences, terms, options) -> float:
    """Seconds for the constrained search alone over every sentence, in the translator's batches."""
    tokenizers, model = checkpoint.tokenizers, checkpoint.model
    tgt_lang, src_lang = checkpoint.config.data.tgt_lang, checkpoint.config.data.src_lang
    examples = [Example(i, ids, []) for i, ids in enumerate(tokenizers.encode_sources(sentences))]
    token_terms = [
        [
            found
            for term in applicable_terms(s, terms, src_lang)
            if (found := token_alternatives(term, tokenizers.target, tgt_lang))
        ]
        for s in sentences
    ]
    constraints = output_constraints(tokenizers.target, options)
    start = time.perf_counter()
    for positions in token_batches(examples, options.max_tokens, shuffle=False):
        batch = collate([examples[p] for p in positions])
        constrained_beam_search(
            model,
            batch.src,
            [token_terms[i] for i in batch.indices],
            options.beam_size,
            options.length_penalty,
            options.max_len_a,
            options.max_len_b,
            no_repeat_ngram=options.no_repeat_ngram,
            constraints=constraints,
        )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/en-zh"))
    parser.add_argument("--set", type=Path, default=Path("benchmarks/en-zh-terms"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    checkpoint = load_checkpoint(find_checkpoint(args.run, None))
    cfg = checkpoint.config
    src_lang, tgt_lang = cfg.data.src_lang, cfg.data.tgt_lang
    sources, references = read_parallel(args.set / f"test.{src_lang}", args.set / f"test.{tgt_lang}")
    terms = read_glossary(args.set / "glossary.tsv")
    options = dataclasses.replace(cfg.decode, n_best=1)

    def translate(glossaries):
        start = time.perf_counter()
        found = translate_sentences(
            checkpoint.model,
            checkpoint.tokenizers,
            sources,
            options,
            cfg.model.max_sequence_tokens,
            tgt_lang,
            glossaries=glossaries,
            source_language=src_lang,
        )
        return [t.texts[0] for t in found], time.perf_counter() - start, found

    times = {"without": [], "with": []}
    for _ in range(args.repeats):  # alternating, so that a slow spell of the machine falls on both
        plain, seconds, _ = translate(None)
        times["without"].append(seconds)
        aided, seconds, translations = translate([terms] * len(sources))
        times["with"].append(seconds)
    everywhere = statistics.median(
        constrained_everywhere(checkpoint, sources, terms, options) for _ in range(args.repeats)
    )
    assert [t.unconstrained for t in translations] == plain, "the first search must be the plain one"

    missed = [
        i
        for i, (source, hypothesis) in enumerate(zip(sources, plain))
        if term_accuracy([source], [hypothesis], terms, src_lang, tgt_lang).share < 1
    ]
    rows = {}
    for name, hypotheses in (("without", plain), ("with", aided)):
        rows[name] = {
            "all": scores(sources, hypotheses, references, terms, src_lang, tgt_lang),
            "missed": scores(
                [sources[i] for i in missed],
                [hypotheses[i] for i in missed],
                [references[i] for i in missed],
                terms,
                src_lang,
                tgt_lang,
            ),
            "seconds": round(statistics.median(times[name]), 2),
        }
    result = {
        "run": str(args.run),
        "set": str(args.set),
        "beam": options.beam_size,
        "glossary_terms": len(terms),
        "sentences_searched_again": len(missed),
        "sentences_changed": sum(t.texts[0] != t.unconstrained for t in translations),
        "unmet_sentences": sum(bool(t.unmet_terms) for t in translations),
        "rows": rows,
        "constrained_everywhere_seconds": round(everywhere, 2),
        "time_ratio": round(rows["with"]["seconds"] / rows["without"]["seconds"], 2),
        "constrained_everywhere_ratio": round(everywhere / rows["without"]["seconds"], 2),
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    print(f"{len(sources)} sentences, {rows['with']['all']['terms']} terms; beam {options.beam_size}\n")
    print("| decoding | term accuracy | BLEU | chrF | missed: term accuracy | missed: BLEU | seconds (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("without", "with"):
        row = rows[name]
        print(
            f"| {name} the glossary | {row['all']['term_accuracy']:.2f}% | {row['all']['bleu']:.2f} | "
            f"{row['all']['chrf']:.2f} | {row['missed']['term_accuracy']:.2f}% | {row['missed']['bleu']:.2f} | "
            f"{row['seconds']:.2f} |"
        )
    print(
        f"\ntime with / without: {result['time_ratio']:.2f}x; {len(missed)} sentences missed a term unaided; "
        f"constrained search on every sentence: {everywhere:.2f} s ({result['constrained_everywhere_ratio']:.2f}x)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
