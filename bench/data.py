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
  and the peak of its memory, sampled from /proc every 0.1 s: RSS; PSS, which splits each shared
  page between the processes that map it; USS, the pages no other process maps (the memory-mapped
  token arrays count here while this process alone maps them); and anonymous memory, what the
  process allocated itself, without any file's pages: the memory that does not live in the page
  cache, and the one that would grow with a corpus held in lists.
- at --ranks-size pairs, `attn train` on two torchrun processes sharing one prepared entry, beside
  one process alike: each rank's peaks, and the peak of their sum (PSS adds up to what they take
  together).

With --filters-size, `attn prepare` is measured again at that size with no filter, every rule of
data.filters but language identification, and every rule: pairs/s and peak memory.

The commands run with the config en-zh.yaml (--smoke: tiny.yaml). Without torchrun on the PATH, the
two-process part is reported as unavailable.

    python3 -m bench.data --sizes 100000 1000000 --json bench_results/data.json
    python3 -m bench.data --sizes 5000000 --ranks-size 0 --filters-size 5000000 --json bench_results/filters.json
    python3 -m bench.data --smoke --workdir /tmp/attn-bench --json /tmp/data.json
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.toolkit import REPO, markdown_table, parser, write_report

CONFIG = "en-zh.yaml"  # the config every command runs with (--smoke: tiny.yaml)


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


_FIELDS = ("rss", "pss", "uss", "anonymous")


def _memory_kb(pid: int) -> dict[str, int]:
    """RSS, PSS, USS and anonymous memory of a process in kB, from /proc/PID/smaps_rollup; zeros once it is gone.

    PSS divides each shared page between the processes that map it, so the PSS of several processes
    adds up to the memory they take together; USS counts only the pages no other process maps."""
    try:
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
        return {
            "rss": fields.get("Rss", 0),
            "pss": fields.get("Pss", 0),
            "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
            "anonymous": fields.get("Anonymous", 0),
        }
    except (OSError, ValueError):
        return dict.fromkeys(_FIELDS, 0)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (torchrun's workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def run(command: list[str], launcher: list[str] | None = None) -> dict:
    """Run an attn command (under `launcher`, e.g. torchrun, whose worker processes are then the ones
    measured); its wall time and the peak memory of each measured process, and of their sum."""
    start = time.perf_counter()
    # Output into files, not pipes: a pipe nobody reads while the process runs would fill and stop it.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            [*(launcher or [sys.executable]), "-m", "attn_cli", *command], stdout=out, stderr=err, text=True, cwd=REPO
        )
        peaks: dict[int, dict[str, int]] = {}
        peak_total = dict.fromkeys(_FIELDS, 0)
        while process.poll() is None:
            measured = _children(process.pid) if launcher else [process.pid]
            samples = {pid: _memory_kb(pid) for pid in measured}
            for pid, sample in samples.items():
                peak = peaks.setdefault(pid, dict.fromkeys(_FIELDS, 0))
                for field in _FIELDS:
                    peak[field] = max(peak[field], sample[field])
            for field in _FIELDS:
                peak_total[field] = max(peak_total[field], sum(sample[field] for sample in samples.values()))
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr[-2000:]}")
    mb = lambda kb: round(kb / 1024)  # noqa: E731
    result = {"seconds": round(time.perf_counter() - start, 1), "stdout": stdout}
    if launcher:
        result["processes"] = [{f"peak_{f}_mb": mb(peak[f]) for f in _FIELDS} for peak in peaks.values()]
        result.update({f"peak_total_{f}_mb": mb(peak_total[f]) for f in _FIELDS})
    else:
        result.update({f"peak_{f}_mb": mb(peak_total[f]) for f in _FIELDS})
    return result


def _settings(corpus: Path, run_dir: Path, config: str) -> list[str]:
    languages = ["--set", "data.src_lang=en", "--set", "data.tgt_lang=zh"]  # the Tatoeba pairs, resampled
    return ["--config", config, "--set", f"data.corpus.path={corpus}", *languages, "--set", f"run_dir={run_dir}"]


def _training(steps: int) -> list[str]:
    return [
        "--set",
        f"train.max_steps={steps}",
        "--set",
        f"train.valid_every={steps}",
        "--set",
        "train.valid_bleu=false",
        "--set",
        "train.max_minutes=null",
    ]


def bench_size(pairs: int, workdir: Path, steps: int, config: str = CONFIG) -> dict:
    corpus = workdir / f"corpus-{pairs}.tsv"
    synthetic_corpus(corpus, pairs, seed=pairs)
    settings = _settings(corpus, workdir / f"run-{pairs}", config)
    tokenizer = run(["tokenizer", *settings])
    first = run(["prepare", *settings, "--json"])
    stats = json.loads(first.pop("stdout"))
    again = run(["prepare", *settings, "--json"])
    again.pop("stdout")
    training = run(["train", *settings, *_training(steps)])
    training.pop("stdout")
    tokenizer.pop("stdout")
    return {
        "pairs": pairs,
        "tokenizer": tokenizer,
        "first_prepare": first,
        "second_prepare": again,
        "train": training,
        "pairs_per_s": round(stats["training_pairs_read"] / first["seconds"]),
        "stats": stats,
    }


def bench_filters(pairs: int, workdir: Path, config: str = CONFIG) -> dict:
    """The first `attn prepare` of the corpus bench_size wrote for `pairs`, in a run of its own given
    that run's tokenizer: with no filter, with every rule of data.filters but language
    identification (those of docs/configuration.md's "Your own data"), and with it too."""
    from bench.cleaning import FILTERS

    corpus = workdir / f"corpus-{pairs}.tsv"
    variants = {"none": {}, "every rule but language_id": FILTERS, "every rule": {**FILTERS, "language_id": True}}
    found = {}
    for name, rules in variants.items():
        run_dir = workdir / f"run-{pairs}-filters-{len(found)}"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(workdir / f"run-{pairs}" / "tokenizer", run_dir / "tokenizer")
        settings = [
            part for key, value in rules.items() for part in ("--set", f"data.filters.{key}={json.dumps(value)}")
        ]
        result = run(["prepare", *_settings(corpus, run_dir, config), *settings, "--json"])
        stats = json.loads(result.pop("stdout"))
        result["pairs_per_s"] = round(stats["corpus_pairs_read"] / result["seconds"])
        result["removed_by_filters"] = stats["removed_by_filters"]
        found[name] = result
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"pairs": pairs, "variants": found}


def bench_two_ranks(pairs: int, workdir: Path, steps: int, config: str = CONFIG) -> dict:
    """`attn train` on two torchrun processes (gloo, one thread each) on the data bench_size prepared
    for `pairs`, in a run directory of its own given that run's tokenizer and sharing one prepared
    entry through data.cache_dir; and one process alike, for comparison. Only training is measured:
    the tokenizer is reused and the entry prepared before."""
    corpus = workdir / f"corpus-{pairs}.tsv"
    cache = workdir / "shared-cache"
    common = [
        "--set",
        f"data.cache_dir={cache}",
        "--set",
        "train.device=cpu",
        "--set",
        "train.threads=1",
        *_training(steps),
    ]
    if shutil.which("torchrun") is None:
        return {"pairs": pairs, "error": "torchrun is not on the PATH"}
    runs = {name: workdir / f"run-{pairs}-{name}" for name in ("one", "two")}
    for directory in runs.values():
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(workdir / f"run-{pairs}" / "tokenizer", directory / "tokenizer")
    run(["prepare", *_settings(corpus, runs["one"], config), "--set", f"data.cache_dir={cache}"])
    one = run(["train", *_settings(corpus, runs["one"], config), *common])
    two = run(
        ["train", *_settings(corpus, runs["two"], config), *common],
        launcher=["torchrun", "--nproc_per_node=2", "--standalone"],
    )
    one.pop("stdout")
    two.pop("stdout")
    return {"pairs": pairs, "one_process": one, "two_processes": two}


def main() -> None:
    arguments = parser(
        __doc__,
        "tiny.yaml, one corpus of 1,000 pairs, 2 training steps, the two processes on it too",
    )
    arguments.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    arguments.add_argument(
        "--ranks-size",
        type=int,
        default=1_000_000,
        help="the size (one of --sizes) at which two torchrun processes are measured; 0: none",
    )
    arguments.add_argument(
        "--ranks-only",
        action="store_true",
        help="measure only the two processes, in a --workdir where an earlier run left the corpus "
        "and tokenizer of --ranks-size",
    )
    arguments.add_argument("--steps", type=int, default=50)
    arguments.add_argument(
        "--filters-size",
        type=int,
        default=0,
        help="the size (one of --sizes) at which `attn prepare` is measured with data.filters on and off; 0: none",
    )
    arguments.add_argument(
        "--workdir",
        type=Path,
        help="where the corpora and runs are written and kept (default: a temporary directory, removed after; "
        "--smoke: its data-smoke/)",
    )
    args = arguments.parse_args()
    config = CONFIG
    if args.smoke:
        config = "tiny.yaml"
        args.sizes, args.ranks_size, args.steps, args.filters_size = [1000], 1000, 2, 1000
        if args.workdir is not None:
            args.workdir = args.workdir / "data-smoke"
            shutil.rmtree(args.workdir, ignore_errors=True)  # measured from the start, as in a new directory

    with tempfile.TemporaryDirectory(prefix="bench_data_") as temporary:
        workdir = (args.workdir or Path(temporary)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        results = []
        for pairs in [] if args.ranks_only else args.sizes:
            results.append(bench_size(pairs, workdir, args.steps, config))
            r = results[-1]
            print(
                f"{pairs:,} pairs: tokenizer {r['tokenizer']['seconds']} s; "
                f"first prepare {r['first_prepare']['seconds']} s "
                f"({r['pairs_per_s']:,} pairs/s, peak RSS {r['first_prepare']['peak_rss_mb']:,} MB); prepare again "
                f"{r['second_prepare']['seconds']} s; train {args.steps} steps {r['train']['seconds']} s, peak RSS "
                f"{r['train']['peak_rss_mb']:,} MB, PSS {r['train']['peak_pss_mb']:,} MB, anonymous "
                f"{r['train']['peak_anonymous_mb']:,} MB",
                flush=True,
            )
        filters = bench_filters(args.filters_size, workdir, config) if args.filters_size in args.sizes else None
        ranks = bench_two_ranks(args.ranks_size, workdir, args.steps, config) if args.ranks_size in args.sizes else None
        if ranks is not None:
            print(f"two processes on {args.ranks_size:,} pairs: {ranks}", flush=True)

    print()
    headers = ["pairs", "tokenizer s", "first prepare s", "pairs/s", "its peak RSS MB", "prepare again s"]
    headers += [f"train {args.steps} steps s", "peak RSS MB", "peak PSS MB", "peak USS MB", "peak anonymous MB"]
    table = [
        [
            r["pairs"],
            r["tokenizer"]["seconds"],
            r["first_prepare"]["seconds"],
            r["pairs_per_s"],
            r["first_prepare"]["peak_rss_mb"],
            r["second_prepare"]["seconds"],
            r["train"]["seconds"],
            r["train"]["peak_rss_mb"],
            r["train"]["peak_pss_mb"],
            r["train"]["peak_uss_mb"],
            r["train"]["peak_anonymous_mb"],
        ]
        for r in results
    ]
    print(markdown_table(headers, table))
    if ranks is not None and "error" in ranks:
        print(f"\ntwo processes: n/a ({ranks['error']})")
    elif ranks is not None:
        one, two = ranks["one_process"], ranks["two_processes"]
        print(f"\n{ranks['pairs']:,} pairs, {args.steps} steps, one thread per process:\n")
        fields = ("peak_rss_mb", "peak_pss_mb", "peak_uss_mb", "peak_anonymous_mb")
        table = [["one", one["seconds"], *(one[field] for field in fields)]]
        for rank, process in enumerate(two["processes"]):
            table.append([f"two: rank {rank}", None, *(process[field] for field in fields)])
        table.append(
            ["two: together", two["seconds"], *(two[field.replace("peak_", "peak_total_")] for field in fields)]
        )
        headers = ["processes", "wall time s", "peak RSS MB", "peak PSS MB", "peak USS MB", "peak anonymous MB"]
        print(markdown_table(headers, table))
        largest_rss = max(process["peak_rss_mb"] for process in two["processes"])
        print(
            f"\ntogether (PSS) {two['peak_total_pss_mb']:,} MB = {two['peak_total_pss_mb'] / largest_rss:.2f} x "
            f"one rank's RSS ({largest_rss:,} MB)"
        )
    if filters is not None:
        print(f"\n`attn prepare` of {filters['pairs']:,} pairs, by data.filters:\n")
        none = filters["variants"]["none"]
        table = [
            [name, found["seconds"], found["pairs_per_s"], round(found["pairs_per_s"] / none["pairs_per_s"], 2)]
            + [
                found["peak_rss_mb"],
                found["peak_rss_mb"] - none["peak_rss_mb"],
                sum(found["removed_by_filters"].values()),
            ]
            for name, found in filters["variants"].items()
        ]
        headers = ["filters", "seconds", "pairs/s", "x no filter", "peak RSS MB", "RSS - no filter MB", "removed"]
        print(markdown_table(headers, table))
    report = {"config": config, "sizes": results, "two_ranks": ranks, "filters": filters, "steps": args.steps}
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
