"""attn's own decoder against its CTranslate2 exports (float32 and int8), on a trained run's test split.

For each system: BLEU and chrF with the run's decode settings (beam 5 for the default config), how
many outputs equal attn's (greedy and beam), and the speed of translating one sentence at a time
and in token-budget batches, greedy and beam 5, in sentences/s and output tokens/s (the median of
--repeats). attn runs on --threads torch threads; each export is timed with 1 and with --threads
intra-op threads, its translator loaded just before its own timings and released after: a live
CTranslate2 translator's worker threads keep spinning between calls and would slow whatever runs
beside them. Every system translates through the same pipeline (`attn_cli.decoding.pipeline`),
attn's engine loaded from the run's best checkpoint, each export's with
`attn_cli.engines.ctranslate2.load_exported`. Prints a table and writes JSON.

    python3 -m bench.serve --run runs/en-zh --json bench_results/serve.json
    python3 -m bench.serve --smoke --json /tmp/serve-smoke.json     # a tiny run, 20 sentences
"""

from __future__ import annotations

import dataclasses
import gc
import platform
import tempfile
import time
from pathlib import Path

from bench.toolkit import markdown_table, median, parser, tiny_run, write_report

QUANTIZATIONS = ("float32", "int8")


def system(engine):
    """translate(sentences, options) -> Translations, with `engine`."""
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source

    return lambda sentences, options: translate(engine, [Source(text) for text in sentences], options)


def export_system(directory: Path, threads: int):
    """translate(sentences, options) with the export in `directory` on `threads` intra-op threads."""
    from attn_cli.engines.ctranslate2 import load_exported

    return system(load_exported(directory, "cpu", threads=threads))


def best_tokens(translation) -> list[str]:
    return translation.candidates[0].tokens if translation.candidates else []


def quality(systems: dict, sources: list[str], references: list[str], decode, language: str) -> dict:
    """BLEU and chrF with the run's decode settings, and the outputs equal to attn's, greedy and beam."""
    from attn_cli.decoding.scoring import score_translations

    found = {}
    outputs = {}
    for name, translate in systems.items():
        outputs[name] = {
            "beam": translate(sources, decode),
            "greedy": translate(sources, dataclasses.replace(decode, beam_size=1, n_best=1)),
        }
        bleu, chrf = score_translations([t.text for t in outputs[name]["beam"]], references, language)
        found[name] = {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2)}
    for name in systems:
        for search in ("greedy", "beam"):
            same = sum(best_tokens(a) == best_tokens(b) for a, b in zip(outputs["attn"][search], outputs[name][search]))
            found[name][f"same_as_attn_{search}"] = same
    return found


def timed(translate, sentences: list[str], options, mode: str, repeats: int) -> tuple[float, int]:
    """The median seconds of translating `sentences` (in batches, or one at a time) and the output tokens."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if mode == "batched":
            translations = translate(sentences, options)
        else:
            translations = [translate([sentence], options)[0] for sentence in sentences]
        times.append(time.perf_counter() - start)
    return median(times), sum(len(best_tokens(t)) for t in translations)


CASES = [(beam, mode) for beam in (1, 5) for mode in ("one at a time", "batched")]


def speed(engine, directory: Path, sources: list[str], single: list[str], decode, threads: int, repeats: int):
    measured = {}  # (system, threads, beam, mode) -> (seconds, tokens, sentences)
    attn = system(engine)
    for beam, mode in CASES:
        sentences = single if mode == "one at a time" else sources
        options = dataclasses.replace(decode, beam_size=beam, n_best=1)
        measured[("attn", threads, beam, mode)] = (*timed(attn, sentences, options, mode, repeats), len(sentences))
    for quantization in QUANTIZATIONS:
        for intra_threads in sorted({1, threads}):
            translate = export_system(directory / quantization, intra_threads)
            for beam, mode in CASES:
                sentences = single if mode == "one at a time" else sources
                options = dataclasses.replace(decode, beam_size=beam, n_best=1)
                measured[(f"ct2 {quantization}", intra_threads, beam, mode)] = (
                    *timed(translate, sentences, options, mode, repeats),
                    len(sentences),
                )
            del translate
            gc.collect()  # the translator and its threads go now, not at some later collection
    rows = []
    for (name, used_threads, beam, mode), (seconds, tokens, sentences) in measured.items():
        attn_seconds = measured[("attn", threads, beam, mode)][0]
        rows.append(
            {
                "search": "greedy" if beam == 1 else f"beam {beam}",
                "mode": mode,
                "system": name,
                "threads": used_threads,
                "sentences": sentences,
                "seconds": round(seconds, 3),
                "sentences_per_s": round(sentences / seconds, 1),
                "tokens_per_s": round(tokens / seconds, 1),
                "speedup_vs_attn": round(attn_seconds / seconds, 2),
            }
        )
    order = {case: i for i, case in enumerate(CASES)}
    rows.sort(
        key=lambda r: (
            order[(1 if r["search"] == "greedy" else 5, r["mode"])],
            r["system"] != "attn",
            r["system"],
            r["threads"],
        )
    )
    return rows


def main() -> None:
    arguments = parser(__doc__, "a tiny run, its first 20 test sentences (5 one at a time), one repeat")
    arguments.add_argument("--run", type=Path, help="the trained run (default runs/en-zh)")
    arguments.add_argument("--threads", type=int, default=2)
    arguments.add_argument("--single", type=int, default=200, help="sentences translated one at a time")
    arguments.add_argument("--repeats", type=int, default=3)
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench")
    args = arguments.parse_args()
    if args.smoke:
        args.run = args.run or tiny_run(args.workdir / "tiny")
        args.single, args.repeats = 5, 1
    args.run = args.run or Path("runs/en-zh")

    import ctranslate2
    import torch

    from attn_cli.engines.load import load_engine
    from attn_cli.export.convert import export
    from attn_cli.paths import RunPaths

    engine = load_engine([args.run], [], None, "cpu", threads=args.threads)
    cfg = engine.config
    paths = RunPaths.of(args.run)
    sources = paths.split_file("test", cfg.data.src_lang).read_text(encoding="utf-8").splitlines()
    references = paths.split_file("test", cfg.data.tgt_lang).read_text(encoding="utf-8").splitlines()
    if args.smoke:
        sources, references = sources[:20], references[:20]
    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        for quantization in QUANTIZATIONS:
            export(cfg, engine.tokenizers, engine.model, directory / quantization, quantization)
        systems = {"attn": system(engine)}
        systems.update({f"ct2 {q}": export_system(directory / q, 1) for q in QUANTIZATIONS})
        scores = quality(systems, sources, references, cfg.decode, cfg.data.tgt_lang)
        del systems
        gc.collect()
        rows = speed(engine, directory, sources, sources[: args.single], cfg.decode, args.threads, args.repeats)

    print(
        f"quality on {len(sources):,} test sentences (beam {cfg.decode.beam_size}, "
        f"length penalty {cfg.decode.length_penalty}):\n"
    )
    print(
        markdown_table(
            ["system", "BLEU", "chrF", "= attn greedy", "= attn beam"],
            [
                [name, found["bleu"], found["chrf"], found["same_as_attn_greedy"], found["same_as_attn_beam"]]
                for name, found in scores.items()
            ],
        )
    )
    print(f"\nspeed (median of {args.repeats}; attn on {args.threads} torch threads):\n")
    print(
        markdown_table(
            ["search", "mode", "system", "threads", "sentences/s", "tokens/s", "x attn"],
            [
                [
                    row["search"],
                    row["mode"],
                    row["system"],
                    row["threads"],
                    row["sentences_per_s"],
                    row["tokens_per_s"],
                    row["speedup_vs_attn"],
                ]
                for row in rows
            ],
        )
    )
    results = {
        "run": str(args.run),
        "sentences": len(sources),
        "decode": dataclasses.asdict(cfg.decode),
        "threads": args.threads,
        "repeats": args.repeats,
        "quality": scores,
        "speed": rows,
        "versions": {
            "torch": torch.__version__,
            "ctranslate2": ctranslate2.__version__,
            "python": platform.python_version(),
        },
    }
    write_report(args.json, results, args)


if __name__ == "__main__":
    main()
