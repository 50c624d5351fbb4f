"""attn's own decoder against its CTranslate2 exports (float32 and int8), on a trained run's test split.

For each system: BLEU and chrF with the run's decode settings (beam 5 for the default config), how
many outputs equal attn's (greedy and beam), and the speed of translating one sentence at a time
and in token-budget batches, greedy and beam 5, in sentences/s and output tokens/s. Every system
runs on the same threads; the timings alternate between systems and the median of --repeats is
kept. Prints a table and writes JSON.

    python3 scripts/bench_serve.py --run runs/en-zh --json bench_results/serve.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attn_cli.decoding.scoring import score_translations
from attn_cli.decoding.translate import translate_sentences
from attn_cli.export.convert import export
from attn_cli.export.exported import load_exported
from attn_cli.paths import RunPaths
from attn_cli.training.checkpoint import find_checkpoint, load_checkpoint

QUANTIZATIONS = ("float32", "int8")


def make_systems(loaded, directory: Path, threads: int) -> dict:
    """name -> translate(sentences, options) for attn and each export."""
    cfg = loaded.config
    limit, language = cfg.model.max_positions - 1, cfg.data.tgt_lang
    systems = {"attn": lambda sentences, options: translate_sentences(loaded.model, loaded.tokenizers, sentences,
                                                                       options, limit, language)}
    for quantization in QUANTIZATIONS:
        export(cfg, loaded.tokenizers, loaded.model, directory / quantization, quantization)
        exported = load_exported(directory / quantization, threads=threads)
        systems[f"ct2 {quantization}"] = (
            lambda sentences, options, exported=exported: translate_sentences(
                None, exported.tokenizers, sentences, options, limit, language,
                search=lambda src: exported.search(src, options)))
    return systems


def quality(systems: dict, sources: list[str], references: list[str], decode, language: str) -> dict:
    """BLEU and chrF with the run's decode settings, and the outputs equal to attn's, greedy and beam."""
    found = {}
    outputs = {}
    for name, translate in systems.items():
        outputs[name] = {"beam": translate(sources, decode),
                         "greedy": translate(sources, dataclasses.replace(decode, beam_size=1, n_best=1))}
        bleu, chrf = score_translations([t.texts[0] for t in outputs[name]["beam"]], references, language)
        found[name] = {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2)}
    for name in systems:
        for search in ("greedy", "beam"):
            same = sum(a.tokens[0] == b.tokens[0] for a, b in zip(outputs["attn"][search], outputs[name][search]))
            found[name][f"same_as_attn_{search}"] = same
    return found


def speed(systems: dict, sources: list[str], single: list[str], decode, repeats: int) -> list[dict]:
    rows = []
    for beam in (1, 5):
        options = dataclasses.replace(decode, beam_size=beam, n_best=1)
        for mode, sentences in (("one at a time", single), ("batched", sources)):
            times = {name: [] for name in systems}
            tokens = {}
            for _ in range(repeats):  # alternate, so that a slow moment of the machine hits every system
                for name, translate in systems.items():
                    start = time.perf_counter()
                    if mode == "batched":
                        translations = translate(sentences, options)
                    else:
                        translations = [translate([sentence], options)[0] for sentence in sentences]
                    times[name].append(time.perf_counter() - start)
                    tokens[name] = sum(len(t.tokens[0]) for t in translations)
            for name in systems:
                seconds = statistics.median(times[name])
                rows.append({"search": "greedy" if beam == 1 else f"beam {beam}", "mode": mode, "system": name,
                             "sentences": len(sentences), "seconds": round(seconds, 3),
                             "sentences_per_s": round(len(sentences) / seconds, 1),
                             "tokens_per_s": round(tokens[name] / seconds, 1),
                             "speedup_vs_attn": round(statistics.median(times["attn"]) / seconds, 2)})
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
        systems = make_systems(loaded, Path(directory), args.threads)
        scores = quality(systems, sources, references, cfg.decode, cfg.data.tgt_lang)
        rows = speed(systems, sources, sources[: args.single], cfg.decode, args.repeats)

    print(f"quality on {len(sources):,} test sentences (beam {cfg.decode.beam_size}, length penalty {cfg.decode.length_penalty}):")
    print(f"{'system':<14} {'BLEU':>6} {'chrF':>6} {'= attn greedy':>14} {'= attn beam':>12}")
    for name, found in scores.items():
        print(f"{name:<14} {found['bleu']:>6.2f} {found['chrf']:>6.2f} {found['same_as_attn_greedy']:>14} "
              f"{found['same_as_attn_beam']:>12}")
    print(f"\nspeed ({args.threads} threads, median of {args.repeats}):")
    print(f"{'search':<7} {'mode':<14} {'system':<14} {'sent/s':>8} {'tok/s':>8} {'x attn':>7}")
    for row in rows:
        print(f"{row['search']:<7} {row['mode']:<14} {row['system']:<14} {row['sentences_per_s']:>8.1f} "
              f"{row['tokens_per_s']:>8.1f} {row['speedup_vs_attn']:>7.2f}")
    if args.json:
        import ctranslate2

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "run": str(args.run), "sentences": len(sources), "decode": dataclasses.asdict(cfg.decode),
            "threads": args.threads, "repeats": args.repeats, "quality": scores, "speed": rows,
            "versions": {"torch": torch.__version__, "ctranslate2": ctranslate2.__version__,
                         "python": platform.python_version()}, "machine": platform.processor() or platform.machine(),
        }, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
