"""Fine-tuning with `train.init_from`: in-domain gain and forgetting, measured on held-out questions.

1. The built-in corpus is cut in two: the pairs whose English holds a question mark (the "domain",
   4,459 pairs) and the rest (general).
2. Base: `en-zh.yaml` trained on the general pairs alone (no question ever seen), for --base-steps
   updates (the default config's 30-minute budget came to 4,722 on this machine; a step count, not
   minutes, so that a busy machine changes the time but not the model).
3. Fine-tuned: a new run with `train.init_from` the base run, on the questions (its own split:
   200 validation and 500 test pairs held out), for --fine-steps updates at --fine-lr.
4. Both models translate both test sets with the config's beam search, scored by `attn eval`:
   the questions' test split (in-domain, before and after) and the general test split (forgetting).

    python3 scripts/bench_finetune.py --workdir runs/finetune --json bench_results/finetune.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path


def split_corpus(workdir: Path) -> tuple[Path, Path, int, int]:
    from attn_cli.config import CorpusConfig
    from attn_cli.data.corpus import read_corpus

    pairs = read_corpus(CorpusConfig(path="builtin:tatoeba-cmn-eng"))
    questions = [pair for pair in pairs if "?" in pair[0]]
    general = [pair for pair in pairs if "?" not in pair[0]]
    paths = workdir / "general.tsv", workdir / "questions.tsv"
    for path, part in zip(paths, (general, questions)):
        path.write_text("".join(f"{source}\t{target}\n" for source, target in part), encoding="utf-8")
    return paths[0], paths[1], len(general), len(questions)


def attn(*arguments: str) -> str:
    """Run an attn command; its stdout (raises with its stderr when it fails)."""
    done = subprocess.run([sys.executable, "-m", "attn_cli", *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"attn {' '.join(arguments)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def scores(checkpoint: Path, split_run: Path) -> dict:
    """BLEU and chrF of `checkpoint` on the test split of `split_run`."""
    output = attn("eval", "--checkpoint", str(checkpoint), "--run", str(split_run))
    found = dict(re.findall(r"^(BLEU|chrF) = ([\d.]+)", output, flags=re.MULTILINE))
    return {name.lower(): float(value) for name, value in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--base-steps", type=int, default=4722)
    parser.add_argument("--fine-steps", type=int, default=400)
    parser.add_argument("--fine-lr", type=float, default=2e-4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    general, questions, general_count, question_count = split_corpus(args.workdir)
    base, fine = args.workdir / "base", args.workdir / "fine"

    started = time.perf_counter()
    if not (base / "checkpoints" / "best.pt").is_file():
        attn(
            "train",
            "--config",
            "en-zh.yaml",
            "--set",
            f"run_dir={base}",
            "--set",
            f"data.corpus.path={general}",
            "--set",
            f"train.max_steps={args.base_steps}",
            "--set",
            "train.max_minutes=null",
        )
    base_seconds = time.perf_counter() - started
    started = time.perf_counter()
    attn(
        "train",
        "--config",
        "en-zh.yaml",
        "--set",
        f"run_dir={fine}",
        "--set",
        f"data.corpus.path={questions}",
        "--set",
        f"train.init_from={base}",
        "--set",
        "data.valid_size=200",
        "--set",
        "data.test_size=500",
        "--set",
        f"train.max_steps={args.fine_steps}",
        "--set",
        "train.max_minutes=null",
        "--set",
        f"train.lr={args.fine_lr}",
        "--set",
        "train.warmup_steps=50",
        "--set",
        "train.valid_every=50",
    )
    fine_seconds = time.perf_counter() - started

    results = {}
    for name, run in (("base", base), ("fine-tuned", fine)):
        checkpoint = run / "checkpoints" / "best.pt"
        results[name] = {"questions": scores(checkpoint, fine), "general": scores(checkpoint, base)}

    print(
        f"\n{question_count:,} question pairs (500 test, 200 validation, the rest to fine-tune on); "
        f"{general_count:,} general pairs; base {args.base_steps:,} steps ({base_seconds / 60:.0f} min), "
        f"fine-tuning {args.fine_steps} steps at lr {args.fine_lr} ({fine_seconds / 60:.1f} min)\n"
    )
    print("| model | questions BLEU | questions chrF | general BLEU | general chrF |")
    print("|---|---:|---:|---:|---:|")
    for name, found in results.items():
        print(
            f"| {name} | {found['questions']['bleu']:.2f} | {found['questions']['chrf']:.2f} "
            f"| {found['general']['bleu']:.2f} | {found['general']['chrf']:.2f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "results": results,
                    "base_steps": args.base_steps,
                    "fine_steps": args.fine_steps,
                    "fine_lr": args.fine_lr,
                    "question_pairs": question_count,
                    "general_pairs": general_count,
                    "base_seconds": round(base_seconds),
                    "fine_seconds": round(fine_seconds),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
