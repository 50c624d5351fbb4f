"""data.filters on known noise: what each rule removes of the noise it is for, and of clean pairs;
then, optionally, the default config trained on the clean corpus, on the noisy one, and on the noisy
one cleaned, scored on the same clean test split.

1. The built-in corpus (Tatoeba English-Chinese) is split by source sentence, with a seed: 500
   validation and 1,000 test pairs, kept clean, and the rest for training.
2. The training pairs are made noisy, reproducibly (--seed), each kind at its rate of the clean
   pairs (about a third in all): duplicates (a pair again, elsewhere), copies (the target is the
   source), swapped sides, misaligned targets (another pair's target), wrong-language targets (another
   pair's English), markup (a tag or an entity in either side) and truncated targets (the first 30%
   of its characters). Each noisy line's kind is recorded.
3. The split of the noisy corpus, with the validation and test files as data.valid_corpus and
   data.test_corpus and the filters of docs/configuration.md ("Your own data"), says which lines
   were kept: per kind of noise the share removed, and the share of clean pairs removed, with the
   rule that removed them.
4. With --train-steps N: `en-zh.yaml` trained for N updates (a step budget, so that a busy machine
   changes the time and not the model) on the clean corpus, the noisy one, and the noisy one with
   the filters; `attn eval` scores each on the clean test split.

    python3 -m bench.cleaning --json bench_results/cleaning.json                      # the rules alone
    python3 -m bench.cleaning --train-steps 1000 --workdir runs/cleaning --json bench_results/cleaning.json
    python3 -m bench.cleaning --smoke --json /tmp/cleaning.json
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.toolkit import attn, eval_scores, markdown_table, parser, write_report

# The noise, each kind as a share of the clean training pairs.
NOISE_RATES = {
    "duplicates": 0.08,
    "copies": 0.04,
    "swapped sides": 0.04,
    "misaligned targets": 0.05,
    "wrong-language targets": 0.04,
    "markup": 0.04,
    "truncated targets": 0.04,
}
# The rules of docs/configuration.md's "Your own data".
FILTERS = {
    "duplicates": "pair",
    "held_out": True,
    "copies": True,
    "max_characters": 1000,
    "max_character_ratio": 9.0,
    "markup": True,
    "max_repeats": 10,
    "control_characters": True,
    "min_script_share": 0.5,
}
TAGS = ["<b>{}</b>", "<i>{}</i>", '<a href="x.html">{}</a>', "{}&nbsp;", "{}<br/>"]


def held_out_split(pairs: list[tuple[str, str]], seed: int, valid: int, test: int):
    """(train, valid, test), no source sentence in two of them: sources in a seeded order."""
    sources = list(dict.fromkeys(source for source, _ in pairs))
    random.Random(seed).shuffle(sources)
    side, count = {}, {"test": 0, "valid": 0}
    by_source = Counter(source for source, _ in pairs)
    for source in sources:
        name = "test" if count["test"] < test else "valid" if count["valid"] < valid else "train"
        side[source] = name
        if name != "train":
            count[name] += by_source[source]
    parts = {"train": [], "valid": [], "test": []}
    for pair in pairs:
        parts[side[pair[0]]].append(pair)
    return parts["train"], parts["valid"], parts["test"]


def make_noisy(clean: list[tuple[str, str]], seed: int) -> list[tuple[str, str, str]]:
    """The clean pairs with noise mixed in: (source, target, kind), kind "clean" for the originals;
    a duplicate comes after its original."""
    generator = random.Random(seed)
    rows = [(source, target, "clean") for source, target in clean]
    for kind, rate in NOISE_RATES.items():
        for _ in range(round(rate * len(clean))):
            index = generator.randrange(len(clean))
            source, target = clean[index]
            other_source, other_target = clean[generator.randrange(len(clean))]
            if kind == "copies":
                target = source
            elif kind == "swapped sides":
                source, target = target, source
            elif kind == "misaligned targets":
                target = other_target
            elif kind == "wrong-language targets":
                target = other_source
            elif kind == "markup":
                words = source.split()
                at = generator.randrange(len(words))
                words[at] = generator.choice(TAGS).format(words[at])
                source = " ".join(words)
            elif kind == "truncated targets":
                target = target[: max(1, int(len(target) * 0.3))]
            noisy = (source, target, kind)
            if kind == "duplicates":  # after its original, so that the copy kept is the clean one
                rows.insert(rows.index((source, target, "clean")) + 1 + generator.randrange(100), noisy)
            else:
                rows.insert(generator.randrange(len(rows) + 1), noisy)
    return rows


def write_tsv(path: Path, pairs) -> Path:
    path.write_text("".join(f"{pair[0]}\t{pair[1]}\n" for pair in pairs), encoding="utf-8")
    return path


def removal_table(noisy_file: Path, kinds: list[str], valid: Path, test: Path) -> tuple[list[dict], dict]:
    """Per kind of noise (and clean), the share of its lines the filters removed, and by which rule."""
    import numpy as np

    from attn_cli.config import CorpusConfig, DataConfig, FiltersConfig
    from attn_cli.data.corpus import ReadReport
    from attn_cli.data.split import TRAIN, split_corpus

    data = DataConfig(
        corpus=CorpusConfig(path=str(noisy_file)),
        valid_corpus=CorpusConfig(path=str(valid)),
        test_corpus=CorpusConfig(path=str(test)),
        filters=FiltersConfig(**FILTERS),
    )
    started = time.perf_counter()
    split = split_corpus(data, ReadReport())
    seconds = time.perf_counter() - started
    kept = set(split.lines[split.roles == TRAIN].tolist())
    by_kind: dict[str, list[int]] = {}
    for line, kind in enumerate(kinds, start=1):
        by_kind.setdefault(kind, []).append(line)
    rows = []
    for kind in ["clean", *NOISE_RATES]:
        lines = by_kind.get(kind, [])
        removed = sum(1 for line in lines if line not in kept)
        rows.append(
            {
                "kind": kind,
                "pairs": len(lines),
                "removed": removed,
                "removed_pct": round(100 * removed / len(lines), 2) if lines else None,
            }
        )
    summary = {
        "rules": dict(split.removals.counts),
        "read": split.read,
        "kept": int(np.count_nonzero(split.roles == TRAIN)),
        "split_seconds": round(seconds, 2),
    }
    return rows, summary


def bleu(checkpoint: Path, src: Path, ref: Path) -> float:
    output = attn("eval", "--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref))
    return eval_scores(output)["bleu"]


def main() -> None:
    arguments = parser(__doc__, "1,000 training pairs, no training")
    arguments.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench" / "cleaning", help="files and runs"
    )
    arguments.add_argument("--seed", type=int, default=1)
    arguments.add_argument("--train-steps", type=int, default=0, help="0: the rules alone, no training")
    args = arguments.parse_args()
    if args.smoke:
        args.workdir, args.train_steps = args.workdir / "cleaning-smoke", 0
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)

    from attn_cli.config import CorpusConfig
    from attn_cli.data.corpus import read_corpus

    pairs = read_corpus(CorpusConfig(path="builtin:tatoeba-cmn-eng"))
    train, valid, test = held_out_split(pairs, args.seed, 500, 1000)
    if args.smoke:
        train = train[:1000]
    noisy = make_noisy(train, args.seed)
    files = {
        "clean": write_tsv(args.workdir / "clean.tsv", train),
        "noisy": write_tsv(args.workdir / "noisy.tsv", noisy),
        "valid": write_tsv(args.workdir / "valid.tsv", valid),
        "test": write_tsv(args.workdir / "test.tsv", test),
    }
    kinds = [kind for _, _, kind in noisy]
    (args.workdir / "noisy-kinds.txt").write_text("\n".join(kinds) + "\n", encoding="utf-8")
    rows, summary = removal_table(files["noisy"], kinds, files["valid"], files["test"])
    print(markdown_table(["kind", "pairs", "removed", "removed %"], [list(row.values()) for row in rows]))
    print(json.dumps(summary))
    results = {
        "noise_rates": NOISE_RATES,
        "filters": FILTERS,
        "corpus": {"train": len(train), "noisy": len(noisy), "valid": len(valid), "test": len(test)},
        "noisy_sha256": hashlib.sha256(files["noisy"].read_bytes()).hexdigest(),
        "removals": rows,
        "split": summary,
    }

    if args.train_steps:
        test_src, test_ref = args.workdir / "test.en", args.workdir / "test.zh"
        test_src.write_text("".join(s + "\n" for s, _ in test), encoding="utf-8")
        test_ref.write_text("".join(t + "\n" for _, t in test), encoding="utf-8")
        trained = []
        for name, corpus, filtered in (
            ("clean", files["clean"], False),
            ("noisy", files["noisy"], False),
            ("noisy, filters", files["noisy"], True),
        ):
            run = args.workdir / name.replace(", ", "-")
            sets = [
                f"run_dir={run}",
                f"data.corpus.path={corpus}",
                f"data.valid_corpus.path={files['valid']}",
                f"data.test_corpus.path={files['test']}",
                "train.max_minutes=null",
                f"train.max_steps={args.train_steps}",
            ]
            sets += [f"data.filters.{key}={value}" for key, value in FILTERS.items()] if filtered else []
            started = time.perf_counter()
            attn("train", "--config", "en-zh.yaml", *[part for item in sets for part in ("--set", item)])
            score = bleu(run / "checkpoints" / "best.pt", test_src, test_ref)
            trained.append({"corpus": name, "bleu": score, "minutes": round((time.perf_counter() - started) / 60, 1)})
            print(f"{name}: BLEU {score}", flush=True)
        clean_bleu, noisy_bleu, filtered_bleu = (row["bleu"] for row in trained)
        lost = clean_bleu - noisy_bleu
        results["training"] = {
            "steps": args.train_steps,
            "rows": trained,
            "recovered_share": round((filtered_bleu - noisy_bleu) / lost, 3) if lost > 0 else None,
        }
        print(markdown_table(["corpus", "BLEU", "minutes"], [list(row.values()) for row in trained]))
    write_report(args.json, results, args)


if __name__ == "__main__":
    main()
