"""The data stage on corpora of many pairs: time and memory of preparing, of starting again, of training.

For each size it writes a synthetic corpus of that many unique pairs (random Tatoeba pairs of the
built-in corpus joined two or three at a time, source with source and target with target), then
measures, each in its own process:
- `attn tokenizer`: training the tokenizer (reported apart, as it samples at most
  `tokenizer.max_training_sentences`);
- `attn prepare`, the first preparation (read, split, tokenize, filter, save): wall time, pairs/s and
  peak memory;
- `attn prepare` again, which finds the prepared data: wall time;
- `attn train` for --steps steps of the default model on the prepared data: wall time to the end,
  and the peak of its memory, sampled from /proc every 0.1 s: RSS; USS, the pages no other process
  maps (the memory-mapped token arrays count here while this process alone maps them); and
  anonymous memory, what the process allocated itself, without any file's pages: the memory that
  does not live in the page cache, and the one that would grow with a corpus held in lists.

    python3 scripts/bench_data.py --sizes 100000 1000000 --json bench_results/data.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def synthetic_corpus(path: Path, pairs: int, seed: int) -> None:
    """`pairs` unique pairs, each two or three random Tatoeba pairs joined."""
    from attn_cli.config import CorpusConfig
    from attn_cli.data.corpus import read_corpus

    tatoeba = read_corpus(CorpusConfig(path="builtin:tatoeba-cmn-eng"))
    rng = random.Random(seed)
    seen: set[str] = set()
    with path.open("w", encoding="utf-8") as out:
        while len(seen) < pairs:
            chosen = [tatoeba[rng.randrange(len(tatoeba))] for _ in range(rng.choice((2, 3)))]
            source = " ".join(s for s, _ in chosen)
            if source in seen:
                continue
            seen.add(source)
            out.write(f"{source}\t{''.join(t for _, t in chosen)}\n")


def _memory_kb(pid: int) -> tuple[int, int, int]:
    """(RSS, USS, anonymous) memory of a process in kB, from /proc/PID/smaps_rollup; zeros once it is gone."""
    try:
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
        return (fields.get("Rss", 0), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
                fields.get("Anonymous", 0))
    except (OSError, ValueError):
        return 0, 0, 0


def run(command: list[str]) -> dict:
    """Run an attn command; its wall time and the peak RSS and USS of the process."""
    start = time.perf_counter()
    # Output into files, not pipes: a pipe nobody reads while the process runs would fill and stop it.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([sys.executable, "-m", "attn_cli", *command], stdout=out, stderr=err, text=True)
        peak_rss = peak_uss = peak_anonymous = 0
        while process.poll() is None:
            rss, uss, anonymous = _memory_kb(process.pid)
            peak_rss, peak_uss, peak_anonymous = max(peak_rss, rss), max(peak_uss, uss), max(peak_anonymous, anonymous)
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr[-2000:]}")
    return {"seconds": round(time.perf_counter() - start, 1), "peak_rss_mb": round(peak_rss / 1024),
            "peak_uss_mb": round(peak_uss / 1024), "peak_anonymous_mb": round(peak_anonymous / 1024), "stdout": stdout}


def bench_size(pairs: int, workdir: Path, steps: int) -> dict:
    corpus = workdir / f"corpus-{pairs}.tsv"
    synthetic_corpus(corpus, pairs, seed=pairs)
    settings = ["--config", "en-zh.yaml", "--set", f"data.corpus.path={corpus}", "--set", f"run_dir={workdir / f'run-{pairs}'}"]
    tokenizer = run(["tokenizer", *settings])
    first = run(["prepare", *settings, "--json"])
    stats = json.loads(first.pop("stdout"))
    again = run(["prepare", *settings, "--json"])
    again.pop("stdout")
    training = run(["train", *settings, "--set", f"train.max_steps={steps}", "--set", f"train.valid_every={steps}",
                    "--set", "train.valid_bleu=false", "--set", "train.max_minutes=null"])
    training.pop("stdout")
    tokenizer.pop("stdout")
    return {"pairs": pairs, "tokenizer": tokenizer, "first_prepare": first, "second_prepare": again, "train": training,
            "pairs_per_s": round(stats["training_pairs_read"] / first["seconds"]), "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_data_") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        results = []
        for pairs in args.sizes:
            results.append(bench_size(pairs, workdir, args.steps))
            r = results[-1]
            print(f"{pairs:,} pairs: tokenizer {r['tokenizer']['seconds']} s; first prepare {r['first_prepare']['seconds']} s "
                  f"({r['pairs_per_s']:,} pairs/s, peak RSS {r['first_prepare']['peak_rss_mb']:,} MB); prepare again "
                  f"{r['second_prepare']['seconds']} s; train {args.steps} steps {r['train']['seconds']} s, peak RSS "
                  f"{r['train']['peak_rss_mb']:,} MB, USS {r['train']['peak_uss_mb']:,} MB, anonymous "
                  f"{r['train']['peak_anonymous_mb']:,} MB", flush=True)

    print(f"\n| pairs | tokenizer | first prepare | pairs/s | its peak RSS | prepare again | train {args.steps} steps "
          f"| peak RSS | peak USS | peak anonymous |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['pairs']:,} | {r['tokenizer']['seconds']} s | {r['first_prepare']['seconds']} s | {r['pairs_per_s']:,} "
              f"| {r['first_prepare']['peak_rss_mb']:,} MB | {r['second_prepare']['seconds']} s | {r['train']['seconds']} s "
              f"| {r['train']['peak_rss_mb']:,} MB | {r['train']['peak_uss_mb']:,} MB | {r['train']['peak_anonymous_mb']:,} MB |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"sizes": results, "steps": args.steps, "python": platform.python_version(),
                                         "machine": platform.machine()}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
