"""The four position schemes on inputs longer than any they trained on.

Each scheme (sinusoidal, learned, relative, rotary) trains the same small model (`en-zh.yaml` with
--set overrides below) for the same number of updates on the built-in corpus, keeping only pairs of
at most 24 source tokens. All runs share one tokenizer and one prepared-data entry. Each then
translates three test sets with beam search, in this process, through attn's translation path
(`attn_cli.decoding.pipeline.translate`), with no input split (no source is longer than the model takes):
- "<= 24": the run's own test split (Tatoeba sentences are short: almost all are <= 24 tokens);
- "25-40" and "> 40": test pairs joined two, three or more at a time (sources with a space, targets
  as they are) until the source has 25-40 tokens, or more than 40 (at most 80); --long of each.
BLEU and chrF per set, and the training time per scheme, go into a table and JSON.

With --join-rate, training also joins pairs into longer ones (train.join, up to --join-max-tokens
tokens a side): whether seeing long inputs in training helps each scheme, against the runs without.

    python3 -m bench.positions --workdir runs/positions --json bench_results/positions.json
    python3 -m bench.positions --workdir runs/positions-join --join-rate 0.2 \
        --tokenizer runs/positions/sinusoidal/tokenizer --json bench_results/positions-join.json
    python3 -m bench.positions --smoke --workdir /tmp/attn-bench --json /tmp/positions.json
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.toolkit import REPO, markdown_table, parser, tiny_run, write_report

SCHEMES = ("sinusoidal", "learned", "relative", "rotary")
SMALL = [
    "model.d_model=128",
    "model.ffn_dim=512",
    "model.num_heads=4",
    "data.max_source_tokens=24",
    "train.max_minutes=null",
    "train.valid_bleu=false",
]


def train(
    scheme: str,
    workdir: Path,
    steps: int,
    cache: Path,
    joining: list[str],
    tokenizer: Path | None,
    config: str = "en-zh.yaml",
) -> float:
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
            config,
            *[part for setting in settings for part in ("--set", setting)],
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
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
    arguments = parser(
        __doc__,
        "tiny.yaml with the small model's settings, 2 updates per scheme with the tiny run's tokenizer, "
        "5 pairs per test set",
    )
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench" / "positions",
        help="where the runs are trained, one directory per scheme (--smoke: in its positions-smoke/)",
    )
    arguments.add_argument("--steps", type=int, default=2000)
    arguments.add_argument("--long", type=int, default=300)
    arguments.add_argument("--join-rate", type=float, default=0.0, help="train.join.rate (0: no joining)")
    arguments.add_argument("--join-max-tokens", type=int, default=80, help="train.join.max_tokens")
    arguments.add_argument("--join-max-pairs", type=int, default=4, help="train.join.max_pairs")
    arguments.add_argument("--tokenizer", type=Path, help="a tokenizer directory every run copies (another run's)")
    arguments.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    arguments.add_argument("--score-only", action="store_true", help="score the runs already in --workdir, train none")
    arguments.add_argument("--length-penalty", type=float, default=0.6, help="decoding, the same for every run")
    arguments.add_argument("--no-repeat-ngram", type=int, default=0, help="decoding, the same for every run")
    args = arguments.parse_args()
    config = "en-zh.yaml"
    if args.smoke:
        args.tokenizer = args.tokenizer or tiny_run(args.workdir / "tiny") / "tokenizer"
        args.workdir, args.steps, args.long, config = args.workdir / "positions-smoke", 2, 5, "tiny.yaml"
    args.workdir = args.workdir.resolve()
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
        tokenizer = args.tokenizer.resolve() if args.tokenizer else None
        seconds = {
            scheme: train(scheme, args.workdir, args.steps, cache, joining, tokenizer, config)
            for scheme in args.schemes
        }

    import torch

    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.scoring import score_translations
    from attn_cli.engines.load import load_checkpoints
    from attn_cli.paths import RunPaths

    first = RunPaths.of(args.workdir / args.schemes[0])
    engine = load_checkpoints([first.last_checkpoint], "cpu", threads=2)
    cfg = engine.config
    sources, references = read_parallel(
        first.split_file("test", cfg.data.src_lang), first.split_file("test", cfg.data.tgt_lang)
    )
    test = list(zip(sources, references))
    count_tokens = lambda text: len(engine.tokenizers.source.encode([text])[0])  # noqa: E731
    sets = {
        "<= 24": [pair for pair in test if count_tokens(pair[0]) <= 24],
        "25-40": long_pairs(test, count_tokens, 25, 40, args.long, seed=1),
        "> 40": long_pairs(test, count_tokens, 41, 80, args.long, seed=2),
    }
    if args.smoke:
        sets["<= 24"] = sets["<= 24"][: args.long]

    results = {}
    for scheme in args.schemes:
        engine = load_checkpoints([RunPaths.of(args.workdir / scheme).last_checkpoint], "cpu", threads=2)
        # The same decoding for every run, whatever its config says: the runs differ in training alone.
        options = dataclasses.replace(
            engine.config.decode, n_best=1, length_penalty=args.length_penalty, no_repeat_ngram=args.no_repeat_ngram
        )
        results[scheme] = {"train_seconds": None if seconds[scheme] is None else round(seconds[scheme])}
        for name, pairs in sets.items():
            longest = max((count_tokens(source) for source, _ in pairs), default=0)
            if longest > engine.max_source_tokens:  # never with these sets: they end at 80 tokens
                raise SystemExit(f"{scheme}: a source of {longest} tokens would be split")
            translations = translate(engine, [Source(source) for source, _ in pairs], options)
            bleu, chrf = score_translations([t.text for t in translations], [r for _, r in pairs], cfg.data.tgt_lang)
            results[scheme][name] = {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2), "pairs": len(pairs)}
        print(scheme, results[scheme], flush=True)

    print(
        f"\n{args.steps} updates each, model d_model 128 / ffn 512 / {cfg.model.encoder_layers}+"
        f"{cfg.model.decoder_layers} layers, training pairs of at most 24 "
        f"source tokens{'; ' + ', '.join(joining) if joining else ''}; BLEU (chrF) by source length, "
        f"beam {cfg.decode.beam_size}, length penalty {args.length_penalty}, no_repeat_ngram {args.no_repeat_ngram}\n"
    )
    headers = ["positions", "training time", *(f"{name} ({len(pairs)} pairs)" for name, pairs in sets.items())]
    table = []
    for scheme, found in results.items():
        minutes = "–" if found["train_seconds"] is None else f"{found['train_seconds'] / 60:.1f} min"
        table.append([scheme, minutes, *(f"{found[name]['bleu']:.2f} ({found[name]['chrf']:.1f})" for name in sets)])
    print(markdown_table(headers, table))
    report = {
        "results": results,
        "steps": args.steps,
        "config": config,
        "settings": SMALL + joining,
        "length_penalty": args.length_penalty,
        "no_repeat_ngram": args.no_repeat_ngram,
        "torch": torch.__version__,
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
