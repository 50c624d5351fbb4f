"""One model for both directions against two single-direction models of the same size.

1. The built-in corpus is split once by attn's own split for a corpus read both ways (`reverse:
   true`: the held-out pairs' Chinese sides are kept out of training too), and written as
   train.tsv, valid.tsv and test.tsv (English<TAB>Chinese), so that all three models learn from the
   same training pairs and are scored on the same test pairs.
2. en→zh and zh→en: `en-zh.yaml` on train.tsv, each for --steps updates.
3. en↔zh: the same config with train.tsv as one corpus of `data.corpora` with `reverse: true`
   (target tags >>zh<< and >>en<<), given the two models' total training: 2 x --steps updates of
   the same size. Updates, not minutes, measure the time: an update of one model costs what an
   update of the other does, and a busy machine would make minutes unequal between the rows.
4. Every model translates test.tsv in its direction(s) with the config's beam search, scored by
   `attn eval` (BLEU by the target language's sacreBLEU tokenizer), twice: with best.pt (chosen by
   validation every 500 updates; for the both-ways model on the mean of its directions) and with
   last.pt, the model at the end of its budget. The two differ where validation picked an earlier
   update.

    python3 -m bench.directions --steps 1200 --json bench_results/directions.json
    python3 -m bench.directions --steps 1200 --rescore ...  # score the runs a call before left in --workdir
    python3 -m bench.directions --smoke --json /tmp/directions.json
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.toolkit import attn, eval_scores, markdown_table, parser, settings, write_report


def write_split(workdir: Path, max_pairs: int | None, valid_size: int, test_size: int) -> dict[str, int]:
    """train.tsv, valid.tsv and test.tsv in `workdir`, as attn splits the built-in corpus read both ways."""
    from attn_cli.config import DataConfig, TrainingCorpus
    from attn_cli.data.split import split_corpus
    from attn_cli.languages import Direction

    both_ways = TrainingCorpus(path="builtin:tatoeba-cmn-eng", reverse=True)
    data = DataConfig(corpora=(both_ways,), max_pairs=max_pairs, valid_size=valid_size, test_size=test_size)
    split = split_corpus(data)
    forward = Direction("en", "zh")
    parts = {"train": list(split.train_pairs()), "valid": split.valid[forward], "test": split.test[forward]}
    for name, pairs in parts.items():
        text = "".join(f"{source}\t{target}\n" for source, target in pairs)
        (workdir / f"{name}.tsv").write_text(text, encoding="utf-8")
    return {name: len(pairs) for name, pairs in parts.items()}


def read_pairs(workdir: Path, name: str) -> list[list[str]]:
    """The pairs of `workdir`'s `name`.tsv as [English, Chinese]."""
    return [line.split("\t") for line in (workdir / f"{name}.tsv").read_text(encoding="utf-8").splitlines()]


def corpus(workdir: Path, name: str, reverse_columns: bool) -> str:
    """A corpus of `workdir`'s split as YAML: English<TAB>Chinese, or read Chinese first."""
    columns = "src_column: 1, tgt_column: 0" if reverse_columns else "src_column: 0, tgt_column: 1"
    return f"{{path: '{workdir / f'{name}.tsv'}', {columns}}}"


def train(config: str, run: Path, data: list[str], budget: list[str]) -> float:
    shutil.rmtree(run, ignore_errors=True)
    started = time.perf_counter()
    attn("train", "--config", config, *settings(f"run_dir={run}", "data.corpus=null", *data, *budget))
    return time.perf_counter() - started


def bleu(run: Path, workdir: Path, source: str, target: str, multi: bool, checkpoint: str) -> float:
    """BLEU of `run`'s `checkpoint` (best.pt or last.pt) translating test.tsv from `source` into `target`."""
    side = {"en": 0, "zh": 1}
    columns = read_pairs(workdir, "test")
    files = {}
    for language in (source, target):
        files[language] = workdir / f"test.{source}-{target}.{language}"
        files[language].write_text("".join(row[side[language]] + "\n" for row in columns), encoding="utf-8")
    extra = ["--target", target] if multi else []
    output = attn(
        "eval", "--checkpoint", run / "checkpoints" / checkpoint, "--src", files[source], "--ref", files[target], *extra
    )
    return eval_scores(output)["bleu"]


def main() -> None:
    from attn_cli.checkpoint import load_checkpoint

    arguments = parser(__doc__, "tiny.yaml, 1,200 pairs, 3 updates per model, in a new directory")
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench" / "directions")
    arguments.add_argument("--steps", type=int, default=1200, help="updates of each single model")
    arguments.add_argument(
        "--rescore", action="store_true", help="score the runs an earlier call left in --workdir, training none"
    )
    args = arguments.parse_args()
    config, max_pairs, valid_size, test_size = "en-zh.yaml", None, 500, 1000
    if args.smoke:
        args.workdir, config = args.workdir / "directions-smoke", "tiny.yaml"
        max_pairs, valid_size, test_size = 1200, 50, 50
        args.steps = 3
    args.workdir = args.workdir.resolve()
    if args.rescore:
        sizes = {name: len(read_pairs(args.workdir, name)) for name in ("train", "valid", "test")}
    else:
        shutil.rmtree(args.workdir, ignore_errors=True)
        args.workdir.mkdir(parents=True)
        sizes = write_split(args.workdir, max_pairs, valid_size, test_size)

    def budget(steps: int) -> list[str]:
        return [f"train.max_steps={steps}", "train.max_minutes=null", "data.max_pairs=null"]

    def single(reverse_columns: bool, source: str, target: str) -> list[str]:
        return [
            f"data.corpora=[{corpus(args.workdir, 'train', reverse_columns)}]",
            f"data.valid_corpus={corpus(args.workdir, 'valid', reverse_columns)}",
            f"data.test_corpus={corpus(args.workdir, 'test', reverse_columns)}",
            f"data.src_lang={source}",
            f"data.tgt_lang={target}",
        ]

    both = [
        f"data.corpora=[{corpus(args.workdir, 'train', False)[:-1]}, reverse: true}}]",
        f"data.valid_corpus={corpus(args.workdir, 'valid', False)}",
        f"data.test_corpus={corpus(args.workdir, 'test', False)}",
        "data.src_lang=en",
        "data.tgt_lang=zh",
    ]
    runs = args.workdir / "en-zh", args.workdir / "zh-en", args.workdir / "both"
    seconds: dict[str, float | None] = {"en→zh": None, "zh→en": None, "en↔zh": None}
    if not args.rescore:
        seconds = {
            "en→zh": train(config, runs[0], single(False, "en", "zh"), budget(args.steps)),
            "zh→en": train(config, runs[1], single(True, "zh", "en"), budget(args.steps)),
            "en↔zh": train(config, runs[2], both, budget(2 * args.steps)),
        }
    results, best_updates = {}, {}
    for checkpoint in ("best.pt", "last.pt"):
        results[checkpoint] = {
            "en→zh": {"en→zh": bleu(runs[0], args.workdir, "en", "zh", False, checkpoint)},
            "zh→en": {"zh→en": bleu(runs[1], args.workdir, "zh", "en", False, checkpoint)},
            "en↔zh": {
                "en→zh": bleu(runs[2], args.workdir, "en", "zh", True, checkpoint),
                "zh→en": bleu(runs[2], args.workdir, "zh", "en", True, checkpoint),
            },
        }
    updates = {}  # read from the checkpoints, so that --rescore reports what the runs it found trained
    for name, run in zip(("en→zh", "zh→en", "en↔zh"), runs):
        best_updates[name] = load_checkpoint(run / "checkpoints" / "best.pt").step
        updates[name] = load_checkpoint(run / "checkpoints" / "last.pt").step
    print(
        f"\n{sizes['train']:,} training pairs, {sizes['valid']:,} validation, {sizes['test']:,} test; "
        f"{config}, {updates['en→zh']:,} updates per direction\n"
    )
    rows = []
    for name in updates:
        taken = "–" if seconds[name] is None else f"{seconds[name] / 60:.1f}"
        scores = [
            results[checkpoint][name].get(direction, "–")
            for direction in ("en→zh", "zh→en")
            for checkpoint in ("best.pt", "last.pt")
        ]
        rows.append([name, f"{updates[name]:,}", taken, f"{best_updates[name]:,}", *scores])
    headers = ["model", "updates", "minutes (whole run)", "best.pt's update", "en→zh BLEU, best.pt", "last.pt"]
    print(markdown_table([*headers, "zh→en BLEU, best.pt", "last.pt"], rows))
    gaps = {
        checkpoint: {
            direction: round(found["en↔zh"][direction] - found[direction][direction], 2)
            for direction in ("en→zh", "zh→en")
        }
        for checkpoint, found in results.items()
    }
    print(f"\nboth-ways model minus single model: {gaps}")
    report = {
        "results": results,
        "gaps": gaps,
        "best_updates": best_updates,
        "seconds": {name: None if value is None else round(value) for name, value in seconds.items()},
        "config": config,
        "steps_per_direction": updates["en→zh"],
        "pairs": sizes,
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
