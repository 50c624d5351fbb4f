"""Casing augmentation (`train.casing`): BLEU on the test split as it is and upper-cased, before and
after augmentation, the same budget each.

1. `en-zh.yaml` trained for --train-steps updates on the built-in corpus (a step budget, so that a
   busy machine changes the time and not the model), once as it is and once with
   `train.casing.upper` and `train.casing.title` (--upper, --title) of the pairs recased each epoch.
2. Each model translates the run's test split (the same for both: same corpus, same seed) with the
   config's beam search, scored by `attn eval`; then the same split with its English sources
   upper-cased (the Chinese references are the same: Chinese has no case), and title-cased.

    python3 -m bench.casing --train-steps 1500 --workdir runs/casing --json bench_results/casing.json
    python3 -m bench.casing --smoke --json /tmp/casing.json
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.toolkit import attn, eval_scores, markdown_table, parser, write_report

VARIANTS = {"as it is": lambda text: text, "upper-cased": str.upper}


def title_case(text: str) -> str:
    from attn_cli.data.casing import title_case as recase

    return recase(text)


def scores(run: Path, source: Path, reference: Path) -> dict:
    """BLEU and chrF of the run's best checkpoint on `source` against `reference`."""
    output = attn("eval", "--run", str(run), "--src", str(source), "--ref", str(reference))
    return eval_scores(output)


def main() -> None:
    arguments = parser(__doc__, "tiny.yaml instead of en-zh.yaml, 2 updates per run, in a new directory")
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench" / "casing",
        help="where the two runs and the recased test files are written (--smoke: in its casing-smoke/)",
    )
    arguments.add_argument("--train-steps", type=int, default=1500)
    arguments.add_argument("--upper", type=float, default=0.1, help="train.casing.upper of the augmented run")
    arguments.add_argument("--title", type=float, default=0.05, help="train.casing.title of the augmented run")
    args = arguments.parse_args()
    config = "en-zh.yaml"
    if args.smoke:
        args.workdir, args.train_steps, config = args.workdir / "casing-smoke", 2, "tiny.yaml"
        shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    variants = {**VARIANTS, "title-cased": title_case}

    runs = {"plain": args.workdir / "plain", "casing": args.workdir / "casing"}
    seconds = {}
    for name, run in runs.items():
        if (run / "checkpoints" / "best.pt").is_file():
            continue  # reused: its time not measured
        casing = [f"train.casing.upper={args.upper}", f"train.casing.title={args.title}"] if name == "casing" else []
        started = time.perf_counter()
        settings = [f"run_dir={run}", f"train.max_steps={args.train_steps}", "train.max_minutes=null", *casing]
        attn("train", "--config", config, *[part for setting in settings for part in ("--set", setting)])
        seconds[name] = round(time.perf_counter() - started)

    from attn_cli.paths import RunPaths

    split = RunPaths.of(runs["plain"])
    sources = split.split_file("test", "en").read_text(encoding="utf-8").splitlines()
    reference = split.split_file("test", "zh")
    for other in runs.values():  # the same corpus and seed: the same test split
        assert RunPaths.of(other).split_file("test", "en").read_text(encoding="utf-8").splitlines() == sources
    files = {}
    for variant, recase in variants.items():
        files[variant] = args.workdir / f"test.{variant.replace(' ', '-')}.en"
        files[variant].write_text("".join(recase(line) + "\n" for line in sources), encoding="utf-8")

    results = {
        name: {variant: scores(run, files[variant], reference) for variant in variants} for name, run in runs.items()
    }
    gap = {name: found["as it is"]["bleu"] - found["upper-cased"]["bleu"] for name, found in results.items()}
    closed = 1 - gap["casing"] / gap["plain"] if gap["plain"] > 0 else None

    casing = f"upper {args.upper}, title {args.title}"
    print(f"\n{len(sources):,} test pairs; {args.train_steps:,} updates per run; casing: {casing}\n")
    table = [
        [name, *(found[variant]["bleu"] for variant in variants), round(gap[name], 2)]
        for name, found in results.items()
    ]
    print(markdown_table(["model", *(f"BLEU, {variant}" for variant in variants), "gap (as it is - upper)"], table))
    if closed is not None:
        print(f"\ncasing closes {closed:.0%} of the upper-case gap")
    report = {
        "results": results,
        "gap": gap,
        "gap_closed": closed,
        "config": config,
        "train_steps": args.train_steps,
        "upper": args.upper,
        "title": args.title,
        "train_seconds": seconds,
        "test_pairs": len(sources),
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
