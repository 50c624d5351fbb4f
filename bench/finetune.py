"""Fine-tuning with `train.init_from`: in-domain gain and forgetting, measured on held-out questions.

1. The built-in corpus is cut in two: the pairs whose English holds a question mark (the "domain",
   4,459 pairs) and the rest (general).
2. Base: `en-zh.yaml` trained on the general pairs alone (no question ever seen), for --base-steps
   updates (the default config's 30-minute budget came to 4,722 on this machine; a step count, not
   minutes, so that a busy machine changes the time but not the model).
3. Fine-tuned: a new run with `train.init_from` the base run, on the questions (its own split:
   200 validation and 500 test pairs held out), for --fine-steps updates at --fine-lr.
4. Mixed: for each of --mix-weights, the same fine-tuning with the general training pairs (those of
   the base run: its validation and test pairs left out) mixed back in as a second corpus of
   `data.corpora` at that weight (0.1 draws a tenth of them each epoch, anew every epoch).
5. Every model translates both test sets with the config's beam search, scored by `attn eval`:
   the questions' test split (in-domain, before and after) and the general test split (forgetting).

A base run already in --workdir is reused (and its time not measured); the fine-tuned run must be new.

    python3 -m bench.finetune --workdir runs/finetune --mix-weights 0.05 0.15 --json bench_results/finetune.json
    python3 -m bench.finetune --smoke --workdir /tmp/attn-bench --json /tmp/finetune.json
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.toolkit import attn, eval_scores, markdown_table, parser, settings, write_report


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


def general_training_pairs(general: Path, base: Path) -> Path:
    """The general pairs the base run trained on: `general` without its validation and test
    sources, written beside it, so that mixing them back in never trains on a general test pair."""
    from attn_cli.paths import RunPaths

    held_out = set()
    for split in ("valid", "test"):
        held_out |= set(RunPaths.of(base).split_file(split, "en").read_text(encoding="utf-8").splitlines())
    lines = general.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if line.split("\t", 1)[0].strip() not in held_out]
    path = general.with_name("general-train.tsv")
    path.write_text("".join(kept), encoding="utf-8")
    return path


def scores(checkpoint: Path, split_run: Path) -> dict:
    """BLEU and chrF of `checkpoint` on the test split of `split_run`."""
    output = attn("eval", "--checkpoint", str(checkpoint), "--run", str(split_run))
    return eval_scores(output)


def main() -> None:
    arguments = parser(
        __doc__, "tiny.yaml instead of en-zh.yaml, 2 base and 2 fine-tuning updates, in a new directory each time"
    )
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench" / "finetune",
        help="where the corpus halves and the two runs are written (--smoke: in its finetune-smoke/)",
    )
    arguments.add_argument("--base-steps", type=int, default=4722)
    arguments.add_argument("--fine-steps", type=int, default=400)
    arguments.add_argument("--fine-lr", type=float, default=2e-4)
    arguments.add_argument(
        "--mix-weights",
        type=float,
        nargs="*",
        default=[0.05, 0.15],
        help="weights of the general pairs mixed into fine-tuning, a run each (none: pure fine-tuning alone)",
    )
    args = arguments.parse_args()
    config = "en-zh.yaml"
    if args.smoke:
        args.workdir, args.base_steps, args.fine_steps, config = args.workdir / "finetune-smoke", 2, 2, "tiny.yaml"
        shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    general, questions, general_count, question_count = split_corpus(args.workdir)
    base, fine = args.workdir / "base", args.workdir / "fine"

    started = time.perf_counter()
    if not (base / "checkpoints" / "best.pt").is_file():
        attn(
            "train",
            "--config",
            config,
            *settings(
                f"run_dir={base}",
                f"data.corpus.path={general}",
                "data.src_lang=en",
                "data.tgt_lang=zh",
                f"train.max_steps={args.base_steps}",
                "train.max_minutes=null",
            ),
        )
    base_seconds = time.perf_counter() - started
    fine_tuning = [
        "data.src_lang=en",
        "data.tgt_lang=zh",
        f"train.init_from={base}",
        "data.valid_size=200",
        "data.test_size=500",
        "data.max_pairs=null",  # every question (tiny.yaml samples): the mixed runs split them alike
        f"train.max_steps={args.fine_steps}",
        "train.max_minutes=null",
        f"train.lr={args.fine_lr}",
        "train.warmup_steps=50",
        "train.valid_every=50",
    ]
    started = time.perf_counter()
    attn("train", "--config", config, *settings(f"run_dir={fine}", f"data.corpus.path={questions}", *fine_tuning))
    fine_seconds = time.perf_counter() - started
    runs = {"base": base, "fine-tuned": fine}
    general_train = general_training_pairs(general, base)
    for weight in args.mix_weights:
        mixed = args.workdir / f"mixed-{weight:g}"
        shutil.rmtree(mixed, ignore_errors=True)
        # The questions first, so that the validation and test splits, carved off the questions
        # alone, are the pure fine-tuning run's own (the same seed, the same pairs).
        corpora = (
            f"[{{path: '{questions}', name: questions}}, "
            f"{{path: '{general_train}', name: general, weight: {weight}, split: false}}]"
        )
        attn(
            "train",
            "--config",
            config,
            *settings(f"run_dir={mixed}", "data.corpus=null", f"data.corpora={corpora}", *fine_tuning),
        )
        runs[f"fine-tuned, general mixed in at {weight:g}"] = mixed
        for split in ("valid", "test"):  # scored on the same questions as the pure fine-tuning
            assert (mixed / "data" / f"{split}.en").read_bytes() == (fine / "data" / f"{split}.en").read_bytes()

    results = {}
    for name, run in runs.items():
        checkpoint = run / "checkpoints" / "best.pt"
        results[name] = {"questions": scores(checkpoint, fine), "general": scores(checkpoint, base)}

    print(
        f"\n{question_count:,} question pairs (500 test, 200 validation, the rest to fine-tune on); "
        f"{general_count:,} general pairs; base {args.base_steps:,} steps ({base_seconds / 60:.0f} min), "
        f"fine-tuning {args.fine_steps} steps at lr {args.fine_lr} ({fine_seconds / 60:.1f} min)\n"
    )
    table = [
        [
            name,
            found["questions"]["bleu"],
            found["questions"]["chrf"],
            found["general"]["bleu"],
            found["general"]["chrf"],
        ]
        for name, found in results.items()
    ]
    print(markdown_table(["model", "questions BLEU", "questions chrF", "general BLEU", "general chrF"], table))
    report = {
        "results": results,
        "config": config,
        "base_steps": args.base_steps,
        "fine_steps": args.fine_steps,
        "fine_lr": args.fine_lr,
        "mix_weights": args.mix_weights,
        "question_pairs": question_count,
        "general_pairs": general_count,
        "base_seconds": round(base_seconds),
        "fine_seconds": round(fine_seconds),
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
