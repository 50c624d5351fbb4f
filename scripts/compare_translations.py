"""Translate a test split with two versions of attn's code and explain every sentence they differ on.

A code change that should compute the same function (a refactoring, another kernel) may still round
differently, and a near-tie between two candidate tokens can then flip. This script translates the
same sentences with the same checkpoint in two source trees (each in its own process, greedy and beam
search), lists the sentences whose outputs differ, and for each finds the first output position
where the token ids part and scores both candidates there with the current tree's model: a gap in
log-probability below --tie (1e-3) is a near-tie. For beam search it also scores both whole
hypotheses (log-probability over the GNMT length penalty), since a beam can also part ways through
a near-tie in the ranking of whole hypotheses. Prints a table and writes JSON.

    python3 scripts/compare_translations.py --checkpoint runs/en-zh/checkpoints/best.pt \\
        --source runs/en-zh/data/test.en --before /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def translate_in_tree(tree: str, checkpoint: str, source: str, beam: int, output: str) -> None:
    """The worker: translate `source` with the code of `tree` and write ids, texts and scores as JSON."""
    sys.path.insert(0, tree)
    try:  # checkpoints below decoding, as in this checkout
        from attn_cli.checkpoint import load_checkpoint
        from attn_cli.decoding.translate import translate_sentences
    except ImportError:  # the layout before it: checkpoints in the training package
        from attn_cli.decoding.translate import translate_sentences
        from attn_cli.training.checkpoint import load_checkpoint
    import torch

    import attn_cli

    loaded = load_checkpoint(checkpoint, "cpu")
    loaded.model.eval()
    options = dataclasses.replace(loaded.config.decode, beam_size=beam, n_best=1)
    sentences = Path(source).read_text(encoding="utf-8").splitlines()
    started = time.perf_counter()
    with torch.inference_mode():
        # As `attn translate` and `attn eval` do: inputs up to the model's positions, less the EOS.
        translations = translate_sentences(
            loaded.model,
            loaded.tokenizers,
            sentences,
            options,
            loaded.config.model.max_positions - 1,
            loaded.config.data.tgt_lang,
        )
    seconds = time.perf_counter() - started
    rows = [
        {
            "text": t.texts[0],
            "parts": len(t.outputs),
            "tokens": t.outputs[0][0].tokens if len(t.outputs) == 1 else None,
            "score": t.scores[0],
        }
        for t in translations
    ]
    Path(output).write_text(
        json.dumps({"code": str(Path(attn_cli.__file__).parent), "seconds": seconds, "rows": rows}, ensure_ascii=False)
    )


def run_worker(tree: Path, args: argparse.Namespace, beam: int, workdir: Path) -> dict:
    output = workdir / f"{tree.name}-{abs(hash(str(tree)))}-beam{beam}.json"
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            str(tree),
            "--checkpoint",
            args.checkpoint,
            "--source",
            args.source,
            "--beams",
            str(beam),
            "--worker-output",
            str(output),
        ],
        check=True,
    )
    return json.loads(output.read_text(encoding="utf-8"))


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where the id sequences differ (the shorter one's length if one is a prefix)."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return min(len(a), len(b))


class Scorer:
    """The current tree's model, scoring target prefixes by teacher forcing (no cache, float32)."""

    def __init__(self, checkpoint: str):
        sys.path.insert(0, str(REPO))
        import torch

        from attn_cli.checkpoint import load_checkpoint
        from attn_cli.decoding.hypothesis import length_penalty
        from attn_cli.vocab import BOS_ID, EOS_ID

        self.torch, self.length_penalty, self.bos, self.eos = torch, length_penalty, BOS_ID, EOS_ID
        self.loaded = load_checkpoint(checkpoint, "cpu")
        self.loaded.model.eval()

    def log_probs(self, source: str, tokens: list[int]):
        """(len(tokens) + 1, V) next-token log-probabilities after BOS and after each token of `tokens`."""
        torch = self.torch
        src = torch.tensor([self.loaded.tokenizers.source.encode([source.strip()])[0] + [self.eos]])
        tgt = torch.tensor([[self.bos] + tokens])
        with torch.inference_mode():
            logits = self.loaded.model.decode(tgt, self.loaded.model.encode(src))[0]
        return logits.float().log_softmax(dim=-1)

    def explain(self, source: str, before: list[int], after: list[int], alpha: float) -> dict:
        position = first_difference(before, after)
        # At the parting position each side emits its own token, or EOS when it has ended there.
        candidates = [ids[position] if position < len(ids) else self.eos for ids in (before, after)]
        log_probs = self.log_probs(source, after[:position])[position]
        step_gap = abs(float(log_probs[candidates[0]] - log_probs[candidates[1]]))
        whole = []
        for ids in (before, after):
            total = float(self.log_probs(source, ids).gather(1, self.torch.tensor(ids + [self.eos])[:, None]).sum())
            whole.append(total / self.length_penalty(len(ids) + 1, alpha))
        return {
            "position": position,
            "candidates": candidates,
            "candidate_log_probs": [float(log_probs[c]) for c in candidates],
            "step_gap": step_gap,
            "hypothesis_scores": whole,
            "hypothesis_gap": abs(whole[0] - whole[1]),
        }


def compare(args: argparse.Namespace) -> dict:
    sources = Path(args.source).read_text(encoding="utf-8").splitlines()
    scorer = Scorer(args.checkpoint)
    alpha = scorer.loaded.config.decode.length_penalty
    report = {
        "checkpoint": args.checkpoint,
        "source": args.source,
        "sentences": len(sources),
        "tie": args.tie,
        "searches": [],
    }
    with tempfile.TemporaryDirectory(prefix="compare_translations_") as workdir:
        for beam in args.beams:
            before = run_worker(Path(args.before).resolve(), args, beam, Path(workdir))
            after = run_worker(REPO, args, beam, Path(workdir))
            differing = []
            for index, (b, a) in enumerate(zip(before["rows"], after["rows"])):
                if b["text"] == a["text"] and b["tokens"] == a["tokens"]:
                    continue
                entry = {"index": index, "source": sources[index], "before": b["text"], "after": a["text"]}
                if b["tokens"] is not None and a["tokens"] is not None:
                    entry.update(scorer.explain(sources[index], b["tokens"], a["tokens"], alpha if beam > 1 else 0.0))
                differing.append(entry)
            report["searches"].append(
                {
                    "beam": beam,
                    "before_code": before["code"],
                    "after_code": after["code"],
                    "before_seconds": before["seconds"],
                    "after_seconds": after["seconds"],
                    "differing": differing,
                }
            )
    return report


def print_report(report: dict) -> None:
    tie = report["tie"]
    for search in report["searches"]:
        differing = search["differing"]
        print(
            f"beam {search['beam']}: {len(differing)} of {report['sentences']} sentences differ "
            f"(before {search['before_seconds']:.1f} s, after {search['after_seconds']:.1f} s)"
        )
        for entry in differing:
            if "step_gap" not in entry:
                print(f"  #{entry['index']}: a long input in several parts, not analysed")
                continue
            verdict = "near-tie" if min(entry["step_gap"], entry["hypothesis_gap"]) < tie else "NOT a near-tie"
            print(
                f"  #{entry['index']} {entry['source']!r}\n      before {entry['before']!r}\n"
                f"      after  {entry['after']!r}\n"
                f"      first differing step {entry['position']}: log-probs {entry['candidate_log_probs'][0]:.6f} vs "
                f"{entry['candidate_log_probs'][1]:.6f} (gap {entry['step_gap']:.2e}); whole hypotheses "
                f"{entry['hypothesis_scores'][0]:.6f} vs {entry['hypothesis_scores'][1]:.6f} "
                f"(gap {entry['hypothesis_gap']:.2e}): {verdict}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--source", required=True, help="one sentence a line, e.g. RUN/data/test.en")
    parser.add_argument("--before", help="the other checkout (its repository root) to compare this one with")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="beam sizes; 1 is greedy")
    parser.add_argument("--tie", type=float, default=1e-3, help="a log-probability gap below this is a near-tie")
    parser.add_argument("--json", default=str(REPO / "bench_results" / "compare_translations.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        translate_in_tree(args.worker, args.checkpoint, args.source, args.beams[0], args.worker_output)
        return
    if not args.before:
        parser.error("--before is required")
    report = compare(args)
    print_report(report)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, ensure_ascii=False, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
