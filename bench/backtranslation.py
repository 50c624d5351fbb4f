"""Back-translation, simulated on the built-in corpus: how much of the BLEU that real parallel data
would add does back-translated monolingual text recover?

1. The built-in corpus is split once (attn's split, 500 validation and 1,000 test pairs), and its
   training pairs are cut in two halves at random: P (parallel) and M, of which only the Chinese
   side is kept (the monolingual text).
2. A zh→en model is trained on P (`en-zh.yaml` read Chinese first), and `attn backtranslate`
   translates M's Chinese into English with it.
3. en→zh models, each for --steps updates of the same size: on P alone; on P plus M
   back-translated, tagged `<bt>`; the same untagged; on P plus M with its real English (the
   ceiling). Each is validated and tested on the same held-out pairs.
4. BLEU on the test split (`attn eval`, the config's beam search), and the share of the gap
   between "P alone" and the ceiling that back-translation recovers.

    python3 -m bench.backtranslation --steps 1000 --json bench_results/backtranslation.json
    python3 -m bench.backtranslation --smoke --json /tmp/backtranslation.json
    python3 -m bench.backtranslation --steps 500 --reverse /tmp/zh-en   # a zh→en run of an earlier call
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench.toolkit import attn, eval_scores, markdown_table, parser, settings, write_report


def write_halves(workdir: Path, max_pairs: int | None, valid_size: int, test_size: int) -> dict[str, int]:
    """P.tsv, M-real.tsv (both sides), M.zh (its Chinese alone), valid.tsv and test.tsv in `workdir`."""
    from attn_cli.config import CorpusConfig, DataConfig
    from attn_cli.data.split import split_corpus

    data = DataConfig(
        corpus=CorpusConfig(path="builtin:tatoeba-cmn-eng"),
        max_pairs=max_pairs,
        valid_size=valid_size,
        test_size=test_size,
    )
    split = split_corpus(data)
    training = list(split.train_pairs())
    random.Random(1).shuffle(training)
    half = len(training) // 2
    parts = {
        "P.tsv": training[:half],
        "M-real.tsv": training[half:],
        "valid.tsv": split.valid[data.languages],
        "test.tsv": split.test[data.languages],
    }
    for name, pairs in parts.items():
        (workdir / name).write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    (workdir / "M.zh").write_text("".join(f"{t}\n" for _, t in training[half:]), encoding="utf-8")
    return {name: len(pairs) for name, pairs in parts.items()}


def train(config: str, run: Path, corpora: str, held_out: list[str], budget: list[str]) -> float:
    shutil.rmtree(run, ignore_errors=True)
    started = time.perf_counter()
    attn(
        "train",
        "--config",
        config,
        *settings(f"run_dir={run}", "data.corpus=null", f"data.corpora={corpora}", *held_out, *budget),
    )
    return time.perf_counter() - started


def bleu(run: Path) -> float:
    """BLEU of `run`'s best checkpoint on its test split (test.tsv)."""
    output = attn("eval", "--checkpoint", run / "checkpoints" / "best.pt", "--run", run)
    return eval_scores(output)["bleu"]


def main() -> None:
    arguments = parser(__doc__, "tiny.yaml, 1,200 pairs, 3 updates per model, in a new directory")
    arguments.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench" / "backtranslation"
    )
    arguments.add_argument("--steps", type=int, default=1000, help="updates of each model")
    arguments.add_argument("--beam", type=int, default=5, help="the zh→en model's beam when back-translating")
    arguments.add_argument(
        "--reverse",
        type=Path,
        help="a zh→en run this script trained before (its workdir's zh-en, copied out: the split is the same), "
        "back-translating instead of a new one",
    )
    args = arguments.parse_args()
    if args.reverse and not (args.reverse / "checkpoints" / "best.pt").is_file():
        arguments.error(f"--reverse {args.reverse}: no checkpoints/best.pt there; give a trained zh→en run")
    config, max_pairs, valid_size, test_size = "en-zh.yaml", None, 500, 1000
    if args.smoke:
        args.workdir, config = args.workdir / "backtranslation-smoke", "tiny.yaml"
        max_pairs, valid_size, test_size, args.beam, args.steps = 1200, 50, 50, 1, 3
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True)
    sizes = write_halves(args.workdir, max_pairs, valid_size, test_size)
    w = args.workdir
    budget = [f"train.max_steps={args.steps}", "train.max_minutes=null", "data.max_pairs=null"]
    english_first = [
        f"data.valid_corpus={{path: '{w / 'valid.tsv'}'}}",
        f"data.test_corpus={{path: '{w / 'test.tsv'}'}}",
        "data.src_lang=en",
        "data.tgt_lang=zh",
    ]
    chinese_first = [
        f"data.valid_corpus={{path: '{w / 'valid.tsv'}', src_column: 1, tgt_column: 0}}",
        f"data.test_corpus={{path: '{w / 'test.tsv'}', src_column: 1, tgt_column: 0}}",
        "data.src_lang=zh",
        "data.tgt_lang=en",
    ]
    seconds = {}
    reverse = args.reverse.resolve() if args.reverse else w / "zh-en"
    if not args.reverse:
        seconds["zh→en on P"] = train(
            config, reverse, f"[{{path: '{w / 'P.tsv'}', src_column: 1, tgt_column: 0}}]", chinese_first, budget
        )
    reverse_steps = torch.load(reverse / "checkpoints" / "best.pt", map_location="cpu", weights_only=False)["step"]
    started = time.perf_counter()
    attn("backtranslate", "--run", reverse, "--input", w / "M.zh", "--output", w / "M-bt.tsv", "--beam", str(args.beam))
    seconds["back-translating M"] = time.perf_counter() - started

    p, bt = f"{{path: '{w / 'P.tsv'}', name: P}}", f"path: '{w / 'M-bt.tsv'}', name: M, split: false"
    rows = {
        "P alone": f"[{p}]",
        "P + M back-translated, tagged <bt>": f"[{p}, {{{bt}, tag: '<bt>'}}]",
        "P + M back-translated, untagged": f"[{p}, {{{bt}}}]",
        "P + M real (ceiling)": f"[{p}, {{path: '{w / 'M-real.tsv'}', name: M, split: false}}]",
    }
    results = {}
    for index, (name, corpora) in enumerate(rows.items()):
        run = w / f"en-zh-{index}"
        seconds[name] = train(config, run, corpora, english_first, budget)
        results[name] = bleu(run)
    alone, ceiling = results["P alone"], results["P + M real (ceiling)"]
    recovered = {
        name: round((results[name] - alone) / (ceiling - alone), 3) if ceiling > alone else None
        for name in rows
        if "back-translated" in name
    }
    print(
        f"\nP {sizes['P.tsv']:,} pairs, M {sizes['M-real.tsv']:,}; {sizes['test.tsv']:,} test pairs; "
        f"{config}, {args.steps:,} updates per model; back-translated with beam {args.beam} by the zh→en model "
        f"of {reverse_steps:,} updates\n"
    )
    if ceiling <= alone:  # more data did not help at this budget: no gap for back-translation to recover
        print(f"the ceiling ({ceiling}) is not above P alone ({alone}): no gap to recover; give more --steps\n")
    table = [[name, bleu_, "–" if recovered.get(name) is None else recovered[name]] for name, bleu_ in results.items()]
    print(markdown_table(["en→zh model", "test BLEU", "share of the gap to the ceiling recovered"], table))
    report = {
        "bleu": results,
        "recovered": recovered,
        "seconds": {name: round(value) for name, value in seconds.items()},
        "pairs": sizes,
        "config": config,
        "steps": args.steps,
        "reverse_run": str(reverse),
        "reverse_steps": reverse_steps,
        "beam": args.beam,
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
