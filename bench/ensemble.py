"""Ensembles: each model alone and all together, BLEU, chrF and speed on one test split.

Every model of --runs must share the tokenizer (train the later runs in a run directory that holds a
copy of the first run's tokenizer/ folder: `attn train` reuses it). Each alone and the ensemble of
all translate the first run's test split, greedy and with the config's beam search, in this one
process on --threads threads, through the translation pipeline (`attn_cli.engines.load.load_engine`
of one run, or of all for the ensemble); the timings of the models are taken in alternation, round
after round, and the table gives BLEU, chrF and output tokens per second (the median of --repeats
timings).

    python3 -m bench.ensemble --runs runs/en-zh runs/en-zh-seed2 --json bench_results/ensemble.json
    python3 -m bench.ensemble --smoke --json /tmp/ensemble-smoke.json     # the tiny run with itself
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from bench.toolkit import alternate, markdown_table, median, parser, tiny_run, write_report


def main() -> None:
    arguments = parser(__doc__, "an ensemble of a tiny run with itself, its first 20 test sentences, one repeat")
    arguments.add_argument("--runs", type=Path, nargs="+", help="the runs (two or more; required unless --smoke)")
    arguments.add_argument("--threads", type=int, default=2)
    arguments.add_argument("--repeats", type=int, default=3)
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench")
    args = arguments.parse_args()
    if args.smoke:
        tiny = tiny_run(args.workdir / "tiny")
        args.runs, args.repeats = args.runs or [tiny, tiny], 1
    if not args.runs:
        arguments.error("--runs is required (or --smoke)")

    import torch

    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.scoring import score_translations
    from attn_cli.engines.load import load_engine
    from attn_cli.paths import RunPaths

    # Each run alone (a run named twice, as in smoke mode, once), then the ensemble of all.
    engines = {str(run): load_engine([run], [], None, "cpu", threads=args.threads) for run in dict.fromkeys(args.runs)}
    ensemble = load_engine(args.runs, [], None, "cpu", threads=args.threads)
    engines[f"ensemble of {len(args.runs)}"] = ensemble
    first = next(iter(engines.values()))
    cfg = first.config
    split = RunPaths.of(args.runs[0])
    sources, references = read_parallel(
        split.split_file("test", cfg.data.src_lang), split.split_file("test", cfg.data.tgt_lang)
    )
    if args.smoke:
        sources, references = sources[:20], references[:20]
    target = first.tokenizers.target

    beams = (1, cfg.decode.beam_size)
    results = [{"model": name} for name in engines]
    for beam in beams:
        options = dataclasses.replace(cfg.decode, beam_size=beam, n_best=1)
        outputs = {}

        def keep(name, translations):
            outputs[name] = translations

        calls = {
            name: (lambda engine=engine: translate(engine, [Source(text) for text in sources], options))
            for name, engine in engines.items()
        }
        seconds = alternate(calls, args.repeats, warmup=False, check=keep)
        for row in results:
            name = row["model"]
            hypotheses = [t.text for t in outputs[name]]
            tokens = sum(len(ids) + 1 for ids in target.encode(hypotheses))  # with each EOS
            bleu, chrf = score_translations(hypotheses, references, cfg.data.tgt_lang)
            middle = median(seconds[name])
            row[f"beam_{beam}"] = {
                "bleu": round(bleu.score, 2),
                "chrf": round(chrf.score, 2),
                "seconds": round(middle, 2),
                "tokens_per_second": round(tokens / middle),
            }
    for row in results:
        print(row["model"], row, flush=True)

    print(f"\n{len(sources):,} test sentences of {args.runs[0]}, {args.threads} threads, median of {args.repeats}\n")
    headers = ["model"] + [f"beam {b}: {what}" for b in beams for what in ("BLEU", "chrF", "tokens/s")]
    table = [
        [row["model"]] + [row[f"beam_{b}"][key] for b in beams for key in ("bleu", "chrf", "tokens_per_second")]
        for row in results
    ]
    print(markdown_table(headers, table))
    report = {
        "results": results,
        "threads": args.threads,
        "repeats": args.repeats,
        "checkpoints": [str(path) for path in ensemble.paths],
        "sentences": len(sources),
        "torch": torch.__version__,
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
