"""attn's own decoder against its CTranslate2 exports (float32 and int8), on a trained run's test split.

For each system: BLEU and chrF with the run's decode settings (beam 5 for the default config), how
many outputs equal attn's (greedy and beam), and the speed of translating one sentence at a time
and in token-budget batches, greedy and beam 5, in sentences/s and output tokens/s (the median of
--repeats). attn runs on --threads torch threads; each export is timed with 1 and with --threads
intra-op threads, its translator loaded just before its own timings and released after: a live
CTranslate2 translator's worker threads keep spinning between calls and would slow whatever runs
beside them. Prints a table and writes JSON.

    python3 scripts/bench_serve.py --run runs/en-zh --json bench_results/serve.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attn_cli.checkpoint import find_checkpoint, load_checkpoint
from attn_cli.decoding.scoring import score_translations
from attn_cli.decoding.translate import translate_sentences
from attn_cli.export.convert import export
from attn_cli.export.exported import load_exported
from attn_cli.paths import RunPaths

QUANTIZATIONS = ("float32", "int8")


def attn_system(loaded):
    cfg = loaded.config
    return lambda sentences, options: translate_sentences(
        loaded.model, loaded.tokenizers, sentences, options, cfg.model.max_sequence_tokens, cfg.data.tgt_lang
    )


def export_system(loaded, directory: Path, threads: int):
    """translate(sentences, options) with the export in `directory` on `threads` intra-op threads."""
    cfg = loaded.config
    exported = load_exported(directory, threads=threads)
    return lambda sentences, options: translate_sentences(
        None,
        exported.tokenizers,
        sentences,
        options,
        cfg.model.max_sequence_tokens,
        cfg.data.tgt_lang,
        search=lambda src: exported.search(src, options),
    )


def quality(systems: dict, sources: list[str], references: list[str], decode, language: str) -> dict:
    """BLEU and chrF with the run's decode settings, and the outputs equal to attn's, greedy and beam."""
    found = {}
    outputs = {}
    for name, translate in systems.items():
        outputs[name] = {
            "beam": translate(sources, decode),
            "greedy": translate(sources, dataclasses.replace(decode, beam_size=1, n_best=1)),
        }
        bleu, chrf = score_translations([t.texts[0] for t in outputs[name]["beam"]], references, language)
        found[name] = {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2)}
    for name in systems:
        for search in ("greedy", "beam"):
            same = sum(a.tokens[0] == b.tokens[0] for a, b in zip(outputs["attn"][search], outputs[name][search]))
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
    return statistics.median(times), sum(len(t.tokens[0]) for t in translations)


CASES = [(beam, mode) for beam in (1, 5) for mode in ("one at a time", "batched")]


def speed(
    loaded, directory: Path, sources: list[str], single: list[str], decode, threads: int, repeats: int
) -> list[dict]:
    measured = {}  # (system, threads, beam, mode) -> (seconds, tokens, sentences)
    attn = attn_system(loaded)
    for beam, mode in CASES:
        sentences = single if mode == "one at a time" else sources
        options = dataclasses.replace(decode, beam_size=beam, n_best=1)
        measured[("attn", threads, beam, mode)] = (*timed(attn, sentences, options, mode, repeats), len(sentences))
    for quantization in QUANTIZATIONS:
        for intra_threads in sorted({1, threads}):
            translate = export_system(loaded, directory / quantization, intra_threads)
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
    for (system, used_threads, beam, mode), (seconds, tokens, sentences) in measured.items():
        attn_seconds = measured[("attn", threads, beam, mode)][0]
        rows.append(
            {
                "search": "greedy" if beam == 1 else f"beam {beam}",
                "mode": mode,
                "system": system,
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/en-zh"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--single", type=int, default=200, help="sentences translated one at a time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    loaded = load_checkpoint(find_checkpoint(args.run, None))
    cfg = loaded.config
    paths = RunPaths.of(args.run)
    sources = paths.split_file("test", cfg.data.src_lang).read_text(encoding="utf-8").splitlines()
    references = paths.split_file("test", cfg.data.tgt_lang).read_text(encoding="utf-8").splitlines()
    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        for quantization in QUANTIZATIONS:
            export(cfg, loaded.tokenizers, loaded.model, directory / quantization, quantization)
        systems = {"attn": attn_system(loaded)}
        systems.update({f"ct2 {q}": export_system(loaded, directory / q, 1) for q in QUANTIZATIONS})
        scores = quality(systems, sources, references, cfg.decode, cfg.data.tgt_lang)
        del systems
        gc.collect()
        rows = speed(loaded, directory, sources, sources[: args.single], cfg.decode, args.threads, args.repeats)

    print(
        f"quality on {len(sources):,} test sentences (beam {cfg.decode.beam_size}, "
        f"length penalty {cfg.decode.length_penalty}):"
    )
    print(f"{'system':<14} {'BLEU':>6} {'chrF':>6} {'= attn greedy':>14} {'= attn beam':>12}")
    for name, found in scores.items():
        print(
            f"{name:<14} {found['bleu']:>6.2f} {found['chrf']:>6.2f} {found['same_as_attn_greedy']:>14} "
            f"{found['same_as_attn_beam']:>12}"
        )
    print(f"\nspeed (median of {args.repeats}; attn on {args.threads} torch threads):")
    print(f"{'search':<7} {'mode':<14} {'system':<14} {'threads':>7} {'sent/s':>8} {'tok/s':>8} {'x attn':>7}")
    for row in rows:
        print(
            f"{row['search']:<7} {row['mode']:<14} {row['system']:<14} {row['threads']:>7} "
            f"{row['sentences_per_s']:>8.1f} {row['tokens_per_s']:>8.1f} {row['speedup_vs_attn']:>7.2f}"
        )
    if args.json:
        import ctranslate2

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
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
                    "machine": platform.processor() or platform.machine(),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
