"""Ensembles: each model alone and all together, BLEU, chrF and speed on one test split.

Every model of --runs must share the tokenizer (train the later runs in a run directory that holds a
copy of the first run's tokenizer/ folder: `attn train` reuses it). Each alone and the ensemble of
all translate the first run's test split, greedy and with the config's beam search, in this one
process, one after the other, on --threads threads; the table gives BLEU, chrF and output tokens per
second (the median of --repeats timings).

    python3 scripts/bench_ensemble.py --runs runs/en-zh runs/en-zh-seed2 --json bench_results/ensemble.json
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

from attn_cli.checkpoint import find_checkpoint, load_checkpoint, require_shared_tokenizers
from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.io import read_parallel
from attn_cli.decoding.scoring import score_translations
from attn_cli.decoding.translate import translate_sentences
from attn_cli.paths import RunPaths


def measure(model, checkpoint, sources, references, beam: int, repeats: int) -> dict:
    options = dataclasses.replace(checkpoint.config.decode, beam_size=beam, n_best=1)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        translations = translate_sentences(
            model,
            checkpoint.tokenizers,
            sources,
            options,
            checkpoint.config.data.max_source_tokens,
            checkpoint.config.data.tgt_lang,
        )
        seconds.append(time.perf_counter() - started)
    hypotheses = [t.texts[0] for t in translations]
    tokens = sum(len(ids) + 1 for ids in checkpoint.tokenizers.target.encode(hypotheses))  # with each EOS
    bleu, chrf = score_translations(hypotheses, references, checkpoint.config.data.tgt_lang)
    median = statistics.median(seconds)
    return {
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
        "seconds": round(median, 2),
        "tokens_per_second": round(tokens / median),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    paths = [find_checkpoint(run, None) for run in args.runs]
    checkpoints = [load_checkpoint(path) for path in paths]
    require_shared_tokenizers([(str(path), c.tokenizers) for path, c in zip(paths, checkpoints)])
    split = RunPaths.of(args.runs[0])
    cfg = checkpoints[0].config
    sources, references = read_parallel(
        split.split_file("test", cfg.data.src_lang), split.split_file("test", cfg.data.tgt_lang)
    )
    models = [(str(run), checkpoint.model) for run, checkpoint in zip(args.runs, checkpoints)]
    models.append((f"ensemble of {len(checkpoints)}", Ensemble([c.model for c in checkpoints])))
    results = []
    for name, model in models:
        row = {"model": name}
        for beam in (1, cfg.decode.beam_size):
            row[f"beam_{beam}"] = measure(model, checkpoints[0], sources, references, beam, args.repeats)
        results.append(row)
        print(name, row, flush=True)

    beams = (1, cfg.decode.beam_size)
    print(f"\n{len(sources):,} test sentences of {args.runs[0]}, {args.threads} threads, median of {args.repeats}\n")
    print("| model | " + " | ".join(f"beam {b}: BLEU | chrF | tokens/s" for b in beams) + " |")
    print("|---|" + "---:|---:|---:|" * len(beams))
    for row in results:
        cells = " | ".join(
            f"{row[f'beam_{b}']['bleu']:.2f} | {row[f'beam_{b}']['chrf']:.2f} | "
            f"{row[f'beam_{b}']['tokens_per_second']:,}"
            for b in beams
        )
        print(f"| {row['model']} | {cells} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "results": results,
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "checkpoints": [str(p) for p in paths],
                    "sentences": len(sources),
                    "torch": torch.__version__,
                    "machine": platform.machine(),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
