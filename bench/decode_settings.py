"""Decoding defaults chosen on real sentences: the length penalty, the guard against degenerate
outputs (`no_loops`, `learned_lengths`) and clause splitting (`split_clauses`).

Decodes the development set (benchmarks/en-zh-dev: 2,039 real held-out sentences, none joined) with
a run's best checkpoint under each setting and scores it as `attn eval --by-length` does, whole and
per source-length bucket: BLEU, length ratio (output over reference characters), and loops: outputs
with a span of 3 or more characters three times back to back, beside the references' count.

The rows: the decoding attn shipped before the guard (the config's beam, length penalty 1.7 and
no_stutter, with neither the guard nor clause splitting; and the same at length penalty 1.0), then
every length penalty below with the guard, with and without clause splitting, and the guard's other
form: decode without it, and decode again with it only the sentences whose output loops or runs past
the learned limit ("retry"). The choice is the row with the best BLEU on all sentences among those
with no more loops than the references and a length ratio within `RATIO_BOUNDS` on the sentences of
more than 15 words. The joined long set (benchmarks/en-zh-long/long-valid.*, long sentences built by
joining short held-out pairs the way `train.join` builds training data) is scored for the first and
the chosen rows, labelled as joined: it flatters a model trained with joining. Each row's decoding
time is kept: the guard's cost is the time with it over the time without, at equal settings.

    python3 -m bench.decode_settings --run runs/en-zh --json bench_results/decode_settings.json
    python3 -m bench.decode_settings --smoke --json /tmp/decode_settings-smoke.json   # a tiny run, 16 sentences
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

from bench.toolkit import REPO, markdown_table, parser, tiny_run, write_report

LENGTH_PENALTIES = (0.6, 1.0, 1.2, 1.4, 1.7)
SHIPPED_PENALTY = 1.7  # the length penalty en-zh.yaml shipped with before the guard
RATIO_BOUNDS = (0.8, 1.25)  # on sentences of more than 15 words
SMOKE = "a tiny run, 16 development and 4 joined long sentences, length penalty 1.0"


def scored(sources: list[str], hypotheses: list[str], references: list[str], language: str) -> dict:
    """Each bucket's row of `attn eval --by-length`, by name ("<= 8", "9-15", "> 15", "all")."""
    from attn_cli.decoding.by_length import scores_by_length

    return {
        row.name: {
            "pairs": row.pairs,
            "bleu": round(row.bleu, 2),
            "chrf": round(row.chrf, 2),
            "length_ratio": round(row.length_ratio, 3),
            "loops": row.loops,
            "reference_loops": row.reference_loops,
            "stutter": round(row.stutter_rate, 4),
        }
        for row in scores_by_length(sources, hypotheses, references, language)
    }


def chosen_among(rows: list[dict]) -> dict | None:
    """The best BLEU on all sentences among rows that loop no more than the references and keep the
    long sentences' length ratio within bounds."""
    low, high = RATIO_BOUNDS

    def sound(row: dict) -> bool:
        longest = row["dev"].get("> 15")
        ratio_ok = longest is None or low <= longest["length_ratio"] <= high
        return row["loops_without_reference_loop"] == 0 and ratio_ok

    candidates = [row for row in rows if sound(row)]
    return max(candidates, key=lambda row: row["dev"]["all"]["bleu"]) if candidates else None


def main() -> None:
    arguments = parser(__doc__, SMOKE)
    arguments.add_argument("--run", type=Path, help="the trained run (default runs/en-zh)")
    arguments.add_argument("--dev", type=Path, default=REPO / "benchmarks" / "en-zh-dev")
    arguments.add_argument("--long", type=Path, default=REPO / "benchmarks" / "en-zh-long")
    arguments.add_argument("--threads", type=int, default=2)
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench")
    args = arguments.parse_args()
    penalties = (1.0,) if args.smoke else LENGTH_PENALTIES
    if args.smoke:
        args.run = args.run or tiny_run(args.workdir / "tiny")
    args.run = args.run or Path("runs/en-zh")

    import torch

    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.loops import loops
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    engine = load_engine([args.run], [], None, "cpu", threads=args.threads)
    cfg = engine.config
    src, tgt = cfg.data.src_lang, cfg.data.tgt_lang
    dev = read_parallel(args.dev / f"dev.{src}", args.dev / f"dev.{tgt}")
    joined = read_parallel(args.long / f"long-valid.{src}", args.long / f"long-valid.{tgt}")
    if args.smoke:
        dev, joined = (dev[0][:16], dev[1][:16]), (joined[0][:4], joined[1][:4])
    shipped = dataclasses.replace(
        cfg.decode, n_best=1, no_stutter=True, no_loops=False, learned_lengths=False, split_clauses=False
    )

    def decode(options, sources: list[str]):
        start = time.perf_counter()
        translations = translate(engine, [Source(text) for text in sources], options)
        return translations, time.perf_counter() - start

    def row_of(name: str, options, translations, seconds: float, guard: str) -> dict:
        row = {
            "name": name,
            "length_penalty": options.length_penalty,
            "guard": guard,
            "split_clauses": options.split_clauses,
            "seconds": round(seconds, 2),
            "dev": scored(dev[0], [t.text for t in translations], dev[1], tgt),
            # outputs with a loop whose reference has none: what the guard is for
            "loops_without_reference_loop": sum(
                loops(t.text) and not loops(reference) for t, reference in zip(translations, dev[1])
            ),
        }
        print(json.dumps(row, ensure_ascii=False), flush=True)
        return row

    def measure(name: str, options) -> tuple[dict, list]:
        translations, seconds = decode(options, dev[0])
        guard = "in the search" if options.no_loops and options.learned_lengths else "off"
        return row_of(name, options, translations, seconds, guard), translations

    rows, outputs = [], {}
    for penalty in sorted({SHIPPED_PENALTY, *penalties}, reverse=True):
        if penalty in (SHIPPED_PENALTY, 1.0):
            options = dataclasses.replace(shipped, length_penalty=penalty)
            row, outputs[("free", penalty)] = measure(f"before the guard, length penalty {penalty}", options)
            rows.append(row)
    for penalty in penalties:
        for clauses in (False, True):
            options = dataclasses.replace(shipped, length_penalty=penalty, no_loops=True, learned_lengths=True)
            options = dataclasses.replace(options, split_clauses=clauses)
            name = f"guard, length penalty {penalty}" + (", clauses" if clauses else "")
            row, outputs[(clauses, penalty)] = measure(name, options)
            rows.append(row)
        # The guard's other form: decoded free, then again with the guard where the output loops or
        # runs past the learned limit. Its first pass is the free decode at this penalty.
        free_options = dataclasses.replace(shipped, length_penalty=penalty)
        if ("free", penalty) not in outputs:
            free, seconds = decode(free_options, dev[0])
            outputs[("free", penalty)] = free
        else:
            seconds = next(r["seconds"] for r in rows if r["name"] == f"before the guard, length penalty {penalty}")
        free = outputs[("free", penalty)]
        again = [
            i for i, t in enumerate(free) if loops(t.text) or _past_limit(engine, dev[0][i], t.candidates[0].tokens)
        ]
        guarded = dataclasses.replace(free_options, no_loops=True, learned_lengths=True)
        redone, extra = decode(guarded, [dev[0][i] for i in again]) if again else ([], 0.0)
        retried = list(free)
        for i, translation in zip(again, redone):
            retried[i] = translation
        row = row_of(f"retry, length penalty {penalty}", guarded, retried, seconds + extra, "retry")
        row["retried"] = len(again)
        rows.append(row)

    chosen = chosen_among([row for row in rows if row["guard"] != "off"])
    for row in [rows[0], *([chosen] if chosen else [])]:
        options = dataclasses.replace(
            shipped,
            length_penalty=row["length_penalty"],
            no_loops=row["guard"] != "off",  # a chosen retry row's joined set is decoded with the guard in the search
            learned_lengths=row["guard"] != "off",
            split_clauses=row["split_clauses"],
        )
        translations, _ = decode(options, joined[0])
        row["joined_long"] = scored(joined[0], [t.text for t in translations], joined[1], tgt)["all"]

    times = {(row["length_penalty"], row["split_clauses"], row["guard"]): row["seconds"] for row in rows}
    guard_cost = {
        penalty: round(times[(penalty, False, "in the search")] / times[(penalty, False, "off")], 3)
        for penalty in penalties
        if (penalty, False, "off") in times and (penalty, False, "in the search") in times
    }
    print(f"\n{args.run}, beam {cfg.decode.beam_size}; {len(dev[0])} development sentences\n")
    table = []
    for row in rows:
        whole, longest = row["dev"]["all"], row["dev"].get("> 15", {})
        table.append(
            [
                row["name"] + (" **chosen**" if row is chosen else ""),
                f"{whole['bleu']:.2f}",
                f"{whole['length_ratio']:.2f}",
                f"{longest.get('bleu', float('nan')):.2f}",
                f"{longest.get('length_ratio', float('nan')):.2f}",
                f"{whole['loops']} ({whole['reference_loops']}), {row['loops_without_reference_loop']}",
                f"{row['seconds']:.1f}",
            ]
        )
    headers = ["decoding", "BLEU, all", "ratio, all", "BLEU, > 15 words", "ratio, > 15 words"]
    headers += ["loops (references), without one in the reference", "seconds"]
    print(markdown_table(headers, table))
    for row in rows:
        if "joined_long" in row:
            long = row["joined_long"]
            print(
                f"\njoined long set (flatters joined training), {row['name']}: BLEU {long['bleu']:.2f}, ratio "
                f"{long['length_ratio']:.2f}, loops {long['loops']} ({long['reference_loops']})"
            )
    if guard_cost:
        print(f"\ndecoding time with the guard / without, by length penalty: {guard_cost}")
    results = {
        "rows": rows,
        "chosen": chosen["name"] if chosen else None,
        "guard_time_ratio": guard_cost,
        "run": str(args.run),
        "beam_size": cfg.decode.beam_size,
        "threads": args.threads,
        "torch": torch.__version__,
    }
    write_report(args.json, results, args)


def _past_limit(engine, source: str, pieces: list[str]) -> bool:
    """Whether an output of `pieces` is longer than the learned limit for `source` allows."""
    if engine.lengths is None:
        return False
    source_length = len(engine.tokenizers.source.encode([source])[0])
    return len(pieces) > int(engine.lengths.bounds([source_length])[1][0])


if __name__ == "__main__":
    main()
