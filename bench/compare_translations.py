"""Translate one input file with two versions of attn's code and list every sentence they differ on.

A change that should compute the same function (a refactoring, another kernel) may still round
differently, and a near-tie between two candidate tokens can then flip. This runs `attn translate
--format jsonl` of each source tree (its own process, PYTHONPATH set to the tree) on the same
checkpoint or export, greedy and with beam search, and compares the best outputs sentence by
sentence. For a differing sentence, --explain scores both outputs with the current tree's model
(teacher-forced log-probabilities) and names the first position where their tokens part.
Prints a table and writes JSON.

    python3 -m bench.compare_translations --run runs/en-zh --source runs/en-zh/data/test.en \\
        --before /path/to/other/checkout --json bench_results/compare.json
    python3 -m bench.compare_translations --model exported/en-zh-int8 --source test.en --before ../old
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.toolkit import REPO, markdown_table, parser, tiny_run, write_report


def translate_with(tree: Path, what: list[str], source: Path, beam: int, output: Path) -> dict:
    """`attn translate` of the code in `tree`: each line's best output text and pieces, and the seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "attn_cli", "translate", *what, "--input", str(source), "--output", str(output)]
    command += ["--format", "jsonl", "--beam", str(beam), "--n-best", "1", "--device", "cpu"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{tree}: attn translate failed:\n{result.stderr[-3000:]}")
    rows = []
    for line in output.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "translation" in record:  # the shape of Translation.to_dict
            rows.append({"text": record["translation"], "tokens": record["n_best"][0]["tokens"]})
        else:  # the JSONL of earlier versions
            best = record["translations"][0]
            rows.append({"text": best["text"], "tokens": best["tokens"]})
    return {"seconds": round(seconds, 2), "rows": rows}


def explain(what: list[str], sources: list[str], before: list[dict], after: list[dict]) -> list[dict]:
    """For each differing sentence: where the pieces part, and each output's log-probability under
    the current tree's model (checkpoints only)."""
    if "--model" in what:
        return [{} for _ in sources]
    import torch

    from attn_cli.engines.load import load_engine

    runs = [Path(what[i + 1]) for i, flag in enumerate(what) if flag == "--run"]
    checkpoints = [Path(what[i + 1]) for i, flag in enumerate(what) if flag == "--checkpoint"]
    engine = load_engine(runs, checkpoints, None, "cpu")
    target = engine.tokenizers.target
    found = []
    for source, old, new in zip(sources, before, after):
        parted = next(
            (i for i, (a, b) in enumerate(zip(old["tokens"], new["tokens"])) if a != b),
            min(len(old["tokens"]), len(new["tokens"])),
        )
        src_ids = engine.tokenizers.encode_sources([source])[0]
        scores = {}
        for name, row in (("before", old), ("after", new)):
            ids = [target.piece_to_id(piece) for piece in row["tokens"]]
            scores[name] = round(_log_prob(engine.model, src_ids, ids, torch), 5)
        found.append({"parted_at": parted, "log_prob": scores})
    return found


def _log_prob(model, src_ids: list[int], output_ids: list[int], torch) -> float:
    """log P(output, EOS | source) under one model, teacher-forced."""
    from attn_cli.vocab import BOS_ID, EOS_ID

    src = torch.tensor([[*src_ids, EOS_ID]])
    tgt_in = torch.tensor([[BOS_ID, *output_ids]])
    with torch.inference_mode():
        log_probs = model(src, tgt_in).float().log_softmax(-1)[0]
    wanted = torch.tensor([*output_ids, EOS_ID])
    return float(log_probs.gather(1, wanted[:, None]).sum())


def compare(args) -> dict:
    what = [flag for run in args.run for flag in ("--run", str(run))]
    what += [flag for checkpoint in args.checkpoint for flag in ("--checkpoint", str(checkpoint))]
    if args.model is not None:
        what = ["--model", str(args.model)]
    sources = args.source.read_text(encoding="utf-8").splitlines()
    results = {"sources": str(args.source), "sentences": len(sources), "before": str(args.before), "beams": {}}
    with tempfile.TemporaryDirectory() as work:
        for beam in args.beams:
            outputs = {}
            for name, tree in (("before", args.before), ("after", REPO)):
                outputs[name] = translate_with(tree.resolve(), what, args.source.resolve(), beam, Path(work) / name)
            differ = [i for i, (a, b) in enumerate(zip(outputs["before"]["rows"], outputs["after"]["rows"])) if a != b]
            shown = differ[: args.explain]
            reasons = explain(
                what,
                [sources[i] for i in shown],
                [outputs["before"]["rows"][i] for i in shown],
                [outputs["after"]["rows"][i] for i in shown],
            )
            results["beams"][str(beam)] = {
                "differ": len(differ),
                "seconds": {name: outputs[name]["seconds"] for name in outputs},
                "differences": [
                    {
                        "line": i + 1,
                        "source": sources[i],
                        "before": outputs["before"]["rows"][i]["text"],
                        "after": outputs["after"]["rows"][i]["text"],
                        **(reasons[n] if n < len(reasons) else {}),
                    }
                    for n, i in enumerate(differ)
                ],
            }
    return results


def main() -> None:
    arguments = parser(__doc__, "this checkout against itself on a tiny model, five sentences")
    arguments.add_argument("--before", type=Path, help="The other source tree (a checkout or a git worktree).")
    arguments.add_argument("--run", type=Path, action="append", default=[], help="Run directory (repeatable).")
    arguments.add_argument("--checkpoint", type=Path, action="append", default=[], help="Checkpoint (repeatable).")
    arguments.add_argument("--model", type=Path, help="A directory attn export wrote, instead of checkpoints.")
    arguments.add_argument("--source", type=Path, help="Sentences to translate, one a line.")
    arguments.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="Beam sizes (1 is greedy).")
    arguments.add_argument("--explain", type=int, default=20, help="Explain at most this many differences per beam.")
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench")
    args = arguments.parse_args()
    if args.smoke:
        args.before = args.before or REPO
        args.run = args.run or [tiny_run(args.workdir / "tiny")]
        args.source = args.workdir / "smoke.en"
        args.source.parent.mkdir(parents=True, exist_ok=True)
        args.source.write_text("Hello.\nWhere is the station?\n\nI love it.\nIt is raining today.\n", encoding="utf-8")
    if args.before is None or args.source is None:
        arguments.error("--before and --source are needed (or --smoke)")
    results = compare(args)
    rows = [
        [beam, result["differ"], results["sentences"], *result["seconds"].values()]
        for beam, result in results["beams"].items()
    ]
    print(markdown_table(["beam", "differ", "of", "before s", "after s"], rows))
    for beam, result in results["beams"].items():
        for difference in result["differences"][: args.explain]:
            print(f"beam {beam}, line {difference['line']}: {difference['before']!r} -> {difference['after']!r}")
    write_report(args.json, results, args)


if __name__ == "__main__":
    main()
