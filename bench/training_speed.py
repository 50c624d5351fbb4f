"""Training speed of two versions of attn on this machine, in turn: --steps updates (default 200) of
the default config with an earlier version's code and with this checkout's, round after round.

Each round runs `attn train` once with each source tree (its own process, PYTHONPATH set to the tree,
run from the tree, a new run directory each time) and times the whole command: startup, corpus,
tokenizer, data preparation and training. The training loop's own time is read from the log of the
validation at the last step (valid_every is past the end, so that is the only one). The earlier
version is a commit, checked out into a temporary git worktree (removed after), or a directory
holding another checkout. The corpus defaults to the built-in one; a commit that predates it needs
a file path. Prints each round, a table of medians and writes JSON.

    python3 -m bench.training_speed 9c599e0                       # 2 rounds, the built-in corpus
    python3 -m bench.training_speed 9c599e0 1 cmn.txt --json bench_results/train_speed_ab.json
    python3 -m bench.training_speed ../other-checkout 3
    python3 -m bench.training_speed --smoke --json /tmp/training_speed.json
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.toolkit import REPO, alternate, markdown_table, median, parser, ratio, write_report


@contextlib.contextmanager
def source_tree(before: str, workdir: Path) -> Iterator[Path]:
    """The tree of `before`: a directory as it is, or a commit checked out into a temporary worktree."""
    if Path(before).is_dir():
        yield Path(before).resolve()
        return
    tree = Path(tempfile.mkdtemp(prefix="attn-before-", dir=workdir))
    tree.rmdir()  # git worktree add makes it
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", str(tree), before], check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def train_command(tree: Path, run_dir: Path, log: Path, config: str, corpus: str, steps: int):
    """A call that runs `attn train` of the code in `tree` into a new `run_dir` and returns the
    training loop's seconds from its log (None where the log does not say)."""
    command = [sys.executable, "-m", "attn_cli", "train", "--config", config]
    for setting in (
        f"run_dir={run_dir}",
        f"data.corpus.path={corpus}",
        "data.src_lang=en",  # the built-in pairs or a copy of them
        "data.tgt_lang=zh",
        f"train.max_steps={steps}",
        "train.max_minutes=null",
        f"train.valid_every={max(1000, steps + 1)}",
        "train.valid_bleu=false",
    ):
        command += ["--set", setting]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    loop = re.compile(rf"validation: step {steps}\b.*?elapsed ([0-9.]+)")

    def run() -> float | None:
        with log.open("w") as output:
            done = subprocess.run(command, cwd=tree, env=env, stdout=output, stderr=subprocess.STDOUT)
        text = log.read_text(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{tree}: attn train failed ({done.returncode}):\n{text[-3000:]}")
        found = loop.search(text)
        return float(found.group(1)) if found else None

    return run


def main() -> None:
    arguments = parser(__doc__, "this checkout against itself, one round of 10 updates of tiny.yaml")
    arguments.add_argument(
        "before", nargs="?", help="The earlier version: a commit (or any git revision), or a checkout's directory."
    )
    arguments.add_argument("rounds", nargs="?", type=int, default=2, help="Rounds, each tree once a round (2).")
    arguments.add_argument(
        "corpus", nargs="?", default="builtin:tatoeba-cmn-eng", help="data.corpus.path (the built-in corpus)."
    )
    arguments.add_argument("--steps", type=int, default=200, help="Training updates per command (200).")
    arguments.add_argument(
        "--config", default="configs/en-zh.yaml", help="The config, relative to each tree (configs/en-zh.yaml)."
    )
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench",
        help="where the runs (and a commit's worktree) are made, in a temporary directory removed after",
    )
    args = arguments.parse_args()
    if args.smoke:
        args.before = args.before or str(REPO)
        args.rounds, args.steps, args.config = 1, 10, "configs/tiny.yaml"
    if args.before is None:
        arguments.error("name the earlier version (a commit or a directory), or give --smoke")

    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="training_speed_", dir=args.workdir) as temporary:
        runs = Path(temporary)
        with source_tree(args.before, runs) as before:
            trees = {args.before: before, "current": REPO}
            if args.before == "current":
                trees = {"before": before, "current": REPO}
            calls, loops = {}, {name: [] for name in trees}
            for index, (name, tree) in enumerate(trees.items()):
                run_dir = runs / f"run{index}"
                calls[name] = train_command(
                    tree, run_dir, runs / f"run{index}.log", args.config, args.corpus, args.steps
                )

            def record(name: str, loop_seconds: float | None) -> None:
                loops[name].append(loop_seconds)
                index = list(trees).index(name)
                shutil.rmtree(runs / f"run{index}", ignore_errors=True)  # every command trains from nothing
                shown = "?" if loop_seconds is None else f"{loop_seconds:.1f}"
                print(f"round {len(loops[name])} {name}: training loop {shown} s", flush=True)

            seconds = alternate(calls, args.rounds, warmup=False, check=record)

    for round_index in range(args.rounds):
        for name in trees:
            loop = loops[name][round_index]
            print(
                f"round {round_index + 1} {name}: whole command {seconds[name][round_index]:.1f} s, "
                f"training loop {'?' if loop is None else f'{loop:.1f}'} s"
            )
    results = {}
    for name, tree in trees.items():
        known = [loop for loop in loops[name] if loop is not None]
        results[name] = {
            "tree": str(tree),
            "whole_command_seconds": seconds[name],
            "training_loop_seconds": loops[name],
            "whole_command_median_s": median(seconds[name]),
            "training_loop_median_s": median(known),
        }
    first, current = list(trees)
    comparison = {
        "whole_command_current_over_before": ratio(
            results[current]["whole_command_median_s"], results[first]["whole_command_median_s"]
        ),
        "training_loop_current_over_before": ratio(
            results[current]["training_loop_median_s"], results[first]["training_loop_median_s"]
        ),
    }
    print()
    table = [
        [
            name,
            round(result["whole_command_median_s"], 1),
            None if result["training_loop_median_s"] is None else round(result["training_loop_median_s"], 1),
        ]
        for name, result in results.items()
    ]
    print(markdown_table(["tree", "whole command s (median)", "training loop s (median)"], table))
    shown = {key: "?" if value is None else f"{value:.2f}" for key, value in comparison.items()}
    print(
        f"current / {first}: whole command {shown['whole_command_current_over_before']}x, "
        f"training loop {shown['training_loop_current_over_before']}x (below 1: the current tree is faster)"
    )
    report = {
        "benchmark": f"attn train, {args.steps} updates of {args.config}, two source trees in turn",
        "before": args.before,
        "rounds": args.rounds,
        "steps": args.steps,
        "config": args.config,
        "corpus": args.corpus,
        "results": results,
        **comparison,
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
