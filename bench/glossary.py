"""Glossary-constrained translation on the kept terminology set: term accuracy, BLEU and time.

Decodes benchmarks/en-zh-terms/test.en (built by tools/build_term_set.py from held-out pairs)
with a run's best checkpoint at the config's beam (5 for en-zh.yaml), without and with the
glossary, in alternation `--repeats` times, and reports for each: term accuracy (the exact-match
share of WMT's terminology tasks), BLEU and chrF against the references, and the median decoding
time. The same scores are given for the sentences whose terms the model misses without the
glossary. One more system, timed in the same rounds, is the constrained search alone on every
sentence, each with the terms that apply to it (what `attn translate --glossary` would cost if it
did not keep the outputs that already hold their terms), for the design's sake.

Translation goes through the pipeline (`attn_cli.decoding.pipeline`): with the glossary, its stages
are called one by one (what `translate` does), to check that the first search is the plain one;
the constrained search alone is the engine's searcher given each part's terms as token alternatives.

    python3 -m bench.glossary --run runs/en-zh --json bench_results/glossary.json
    python3 -m bench.glossary --smoke --json /tmp/glossary-smoke.json     # a tiny run, 3 sentences, 2 terms
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from bench.toolkit import REPO, alternate, markdown_table, median, parser, ratio, tiny_run, write_report

# Smoke mode's own set: a few sentences and terms the tiny run's target vocabulary can write.
SMOKE_PAIRS = [
    ("Tom is a teacher.", "汤姆是老师。"),
    ("I like my cat.", "我喜欢我的猫。"),
    ("Where is it?", "在哪里？"),
]
SMOKE_TERMS = "Tom\t汤姆\ncat\t猫\n"


def rounded(value, digits: int = 2):
    return None if value is None else round(value, digits)


def scores(sources, hypotheses, references, terms, src_lang, tgt_lang) -> dict:
    from attn_cli.decoding.glossary import term_accuracy
    from attn_cli.decoding.scoring import score_translations

    bleu, chrf = score_translations(hypotheses, references, tgt_lang)
    accuracy = term_accuracy(sources, hypotheses, terms, src_lang, tgt_lang)
    return {
        "sentences": len(sources),
        "terms": accuracy.applied,
        "term_accuracy": round(100 * accuracy.share, 2),
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
    }


def constrained_everywhere(engine, sentences, terms, options):
    """A call that runs the constrained search alone over every sentence (each part with the terms
    that apply to it, none for some), in the pipeline's batches."""
    from attn_cli.decoding.batches import Progress, decode_parts
    from attn_cli.decoding.glossary import token_alternatives
    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.records import Source

    target, tgt_lang = engine.tokenizers.target, engine.config.data.tgt_lang
    sources = [Source(sentence, terms=tuple(terms)) for sentence in sentences]
    parts = [part for prepared in split_sources(engine, sources, options) for part in prepared.parts]
    token_terms = [
        [found for term in part.terms if (found := token_alternatives(term, target, tgt_lang))] for part in parts
    ]

    def call():
        search = engine.searcher(options)
        return decode_parts(parts, search, options.max_tokens, Progress(None, len(parts)), token_terms)

    return call


def main() -> None:
    arguments = parser(__doc__, "a tiny run, three sentences and two terms of its own, one round")
    arguments.add_argument("--run", type=Path, help="the trained run (default runs/en-zh)")
    arguments.add_argument("--set", type=Path, default=REPO / "benchmarks" / "en-zh-terms")
    arguments.add_argument("--repeats", type=int, default=3)
    arguments.add_argument("--threads", type=int, default=2)
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench")
    args = arguments.parse_args()
    if args.smoke:
        args.run = args.run or tiny_run(args.workdir / "tiny")
        args.set, args.repeats = args.workdir / "glossary-smoke", 1
        args.set.mkdir(parents=True, exist_ok=True)
        for side, language in ((0, "en"), (1, "zh")):
            text = "".join(pair[side] + "\n" for pair in SMOKE_PAIRS)
            (args.set / f"test.{language}").write_text(text, encoding="utf-8")
        (args.set / "glossary.tsv").write_text(SMOKE_TERMS, encoding="utf-8")
    args.run = args.run or Path("runs/en-zh")

    import torch

    from attn_cli.decoding.glossary import read_glossary, term_accuracy
    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.pipeline import assemble, decode, translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    engine = load_engine([args.run], [], None, "cpu", threads=args.threads)
    cfg = engine.config
    src_lang, tgt_lang = cfg.data.src_lang, cfg.data.tgt_lang
    sources, references = read_parallel(args.set / f"test.{src_lang}", args.set / f"test.{tgt_lang}")
    terms = read_glossary(args.set / "glossary.tsv")
    options = dataclasses.replace(cfg.decode, n_best=1)
    outputs = {}

    def without():
        return translate(engine, [Source(sentence) for sentence in sources], options)

    def with_glossary():
        # translate(), its stages spelled out, so that the first search's outputs can be compared.
        prepared = split_sources(engine, [Source(sentence, terms=tuple(terms)) for sentence in sources], options)
        decoded = decode(engine, prepared, options)
        return assemble(engine, prepared, decoded.outputs, options), (prepared, decoded.first)

    def keep(name, result):
        outputs[name] = result

    everywhere_call = constrained_everywhere(engine, sources, terms, options)
    systems = {"without": without, "with": with_glossary, "everywhere": everywhere_call}
    times = alternate(systems, args.repeats, warmup=False, check=keep)
    plain = [t.text for t in outputs["without"]]
    translations, (prepared, first) = outputs["with"]
    aided = [t.text for t in translations]
    unconstrained = [t.text for t in assemble(engine, prepared, first, options)]
    assert unconstrained == plain, "the first search must be the plain one"
    everywhere = median(times["everywhere"])

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
            "seconds": round(median(times[name]), 2),
        }
    result = {
        "run": str(args.run),
        "set": str(args.set),
        "beam": options.beam_size,
        "glossary_terms": len(terms),
        "sentences_searched_again": len(missed),
        "sentences_changed": sum(a != p for a, p in zip(aided, plain)),
        "unmet_sentences": sum(bool(t.unmet_terms) for t in translations),
        "rows": rows,
        "constrained_everywhere_seconds": round(everywhere, 2),
        "time_ratio": rounded(ratio(median(times["with"]), median(times["without"]))),
        "constrained_everywhere_ratio": rounded(ratio(everywhere, median(times["without"]))),
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
    }
    print(f"{len(sources)} sentences, {rows['with']['all']['terms']} terms; beam {options.beam_size}\n")
    print(
        markdown_table(
            ["decoding", "term accuracy", "BLEU", "chrF", "missed: term accuracy", "missed: BLEU", "seconds (median)"],
            [
                [
                    f"{name} the glossary",
                    f"{row['all']['term_accuracy']:.2f}%",
                    row["all"]["bleu"],
                    row["all"]["chrf"],
                    f"{row['missed']['term_accuracy']:.2f}%",
                    row["missed"]["bleu"],
                    row["seconds"],
                ]
                for name, row in rows.items()
            ],
        )
    )
    print(
        f"\ntime with / without: {result['time_ratio']}x; {len(missed)} sentences missed a term unaided; "
        f"constrained search on every sentence: {everywhere:.2f} s ({result['constrained_everywhere_ratio']}x)"
    )
    write_report(args.json, result, args)


if __name__ == "__main__":
    main()
