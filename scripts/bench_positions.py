"""The four position schemes on inputs longer than any they trained on.

Each scheme (sinusoidal, learned, relative, rotary) trains the same small model (`en-zh.yaml` with
--set overrides below) for the same number of updates on the built-in corpus, keeping only pairs of
at most 24 source tokens. All runs share one tokenizer and one prepared-data entry. Each then
translates three test sets with beam search, in this process, with no input split:
- "<= 24": the run's own test split (Tatoeba sentences are short: almost all are <= 24 tokens);
- "25-40" and "> 40": test pairs joined two, three or more at a time (sources with a space, targets
  as they are) until the source has 25-40 tokens, or more than 40 (at most 80); --long of each.
BLEU and chrF per set, and the training time per scheme, go into a table and JSON.

With --join-rate, training also joins pairs into longer ones (train.join, up to --join-max-tokens
tokens a side): whether seeing long inputs in training helps each scheme, against the runs without.

    python3 scripts/bench_positions.py --workdir runs/positions --json bench_results/positions.json
    python3 scripts/bench_positions.py --workdir runs/positions-join --join-rate 0.2 \
        --tokenizer runs/positions/sinusoidal/tokenizer --json bench_results/positions-join.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

SCHEMES = ("sinusoidal", "learned", "relative", "rotary")
SMALL = [
    "model.d_model=128",
    "model.ffn_dim=512",
    "model.num_heads=4",
    "data.max_source_tokens=24",
    "train.max_minutes=null",
    "train.valid_bleu=false",
]


def train(scheme: str, workdir: Path, steps: int, cache: Path, joining: list[str], tokenizer: Path | None) -> float:
    run = workdir / scheme
    if (run / "checkpoints" / "last.pt").is_file():
        shutil.rmtree(run)  # a run is measured whole, never resumed
    first = tokenizer or workdir / SCHEMES[0] / "tokenizer"
    if (scheme != SCHEMES[0] or tokenizer) and first.is_dir() and not (run / "tokenizer").is_dir():
        shutil.copytree(first, run / "tokenizer")  # one tokenizer for all: the runs differ in positions alone
    settings = [
        *SMALL,
        *joining,
        f"model.positions={scheme}",
        f"run_dir={run}",
        f"data.cache_dir={cache}",
        f"train.max_steps={steps}",
        f"train.valid_every={steps}",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "attn_cli",
            "train",
            "--config",
            "en-zh.yaml",
            *[part for setting in settings for part in ("--set", setting)],
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"training {scheme} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def long_pairs(
    pairs: list[tuple[str, str]], count_tokens, low: int, high: int, count: int, seed: int
) -> list[tuple[str, str]]:
    """`count` pairs whose source has low..high tokens, each made of test pairs joined in a row."""
    rng = random.Random(seed)
    made = []
    while len(made) < count:
        parts = [pairs[rng.randrange(len(pairs))]]
        while count_tokens(" ".join(s for s, _ in parts)) < low:
            parts.append(pairs[rng.randrange(len(pairs))])
        source = " ".join(s for s, _ in parts)
        if count_tokens(source) <= high:
            made.append((source, "".join(t for _, t in parts)))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--long", type=int, default=300)
    parser.add_argument("--join-rate", type=float, default=0.0, help="train.join.rate (0: no joining)")
    parser.add_argument("--join-max-tokens", type=int, default=80, help="train.join.max_tokens")
    parser.add_argument("--join-max-pairs", type=int, default=4, help="train.join.max_pairs")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer directory every run copies (another run's)")
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    parser.add_argument("--score-only", action="store_true", help="score the runs already in --workdir, train none")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="decoding, the same for every run")
    parser.add_argument("--no-repeat-ngram", type=int, default=0, help="decoding, the same for every run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    cache = args.workdir / "prepared"
    joining = (
        [
            f"train.join.rate={args.join_rate}",
            f"train.join.max_tokens={args.join_max_tokens}",
            f"train.join.max_pairs={args.join_max_pairs}",
        ]
        if args.join_rate
        else []
    )
    if args.score_only:
        earlier = (
            json.loads(args.json.read_text(encoding="utf-8"))["results"] if args.json and args.json.is_file() else {}
        )
        seconds = {scheme: earlier.get(scheme, {}).get("train_seconds") for scheme in args.schemes}
    else:
        seconds = {
            scheme: train(scheme, args.workdir, args.steps, cache, joining, args.tokenizer) for scheme in args.schemes
        }

    import torch

    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.scoring import score_translations
    from attn_cli.decoding.translate import translate_sentences
    from attn_cli.paths import RunPaths

    torch.set_num_threads(2)
    first = RunPaths.of(args.workdir / args.schemes[0])
    checkpoint = load_checkpoint(first.last_checkpoint)
    cfg = checkpoint.config
    sources, references = read_parallel(
        first.split_file("test", cfg.data.src_lang), first.split_file("test", cfg.data.tgt_lang)
    )
    test = list(zip(sources, references))
    count_tokens = lambda text: len(checkpoint.tokenizers.source.encode([text])[0])  # noqa: E731
    sets = {
        "<= 24": [pair for pair in test if count_tokens(pair[0]) <= 24],
        "25-40": long_pairs(test, count_tokens, 25, 40, args.long, seed=1),
        "> 40": long_pairs(test, count_tokens, 41, 80, args.long, seed=2),
    }

    results = {}
    for scheme in args.schemes:
        model = load_checkpoint(RunPaths.of(args.workdir / scheme).last_checkpoint)
        # The same decoding for every run, whatever its config says: the runs differ in training alone.
        options = dataclasses.replace(
            model.config.decode, n_best=1, length_penalty=args.length_penalty, no_repeat_ngram=args.no_repeat_ngram
        )
        results[scheme] = {"train_seconds": None if seconds[scheme] is None else round(seconds[scheme])}
        for name, pairs in sets.items():
            translations = translate_sentences(
                model.model,
                model.tokenizers,
                [s for s, _ in pairs],
                options,
                max_source_tokens=10_000,
                target_language=cfg.data.tgt_lang,
            )
            bleu, chrf = score_translations(
                [t.texts[0] for t in translations], [r for _, r in pairs], cfg.data.tgt_lang
            )
            results[scheme][name] = {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2), "pairs": len(pairs)}
        print(scheme, results[scheme], flush=True)

    print(
        f"\n{args.steps} updates each, model d_model 128 / ffn 512 / 3+3 layers, training pairs of at most 24 "
        f"source tokens{'; ' + ', '.join(joining) if joining else ''}; BLEU (chrF) by source length, "
        f"beam {cfg.decode.beam_size}, length penalty {args.length_penalty}, no_repeat_ngram {args.no_repeat_ngram}\n"
    )
    print(
        "| positions | training time | "
        + " | ".join(f"{name} ({len(pairs)} pairs)" for name, pairs in sets.items())
        + " |"
    )
    print("|---|---:|" + "---:|" * len(sets))
    for scheme, found in results.items():
        cells = " | ".join(f"{found[name]['bleu']:.2f} ({found[name]['chrf']:.1f})" for name in sets)
        minutes = "–" if found["train_seconds"] is None else f"{found['train_seconds'] / 60:.1f} min"
        print(f"| {scheme} | {minutes} | {cells} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "results": results,
                    "steps": args.steps,
                    "settings": SMALL + joining,
                    "length_penalty": args.length_penalty,
                    "no_repeat_ngram": args.no_repeat_ngram,
                    "torch": torch.__version__,
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
