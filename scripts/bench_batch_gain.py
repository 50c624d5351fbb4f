"""How much a decoding engine gains from batching alone, without HTTP: sentences/s translating the
test split in batches of 1, 8 and 32 sentences through `attn_cli.translator.translate` (what the
`attn serve` model worker calls), for a checkpoint (PyTorch) and an `attn export` (CTranslate2).

It bounds what batching across requests can give a server: at 16 clients the worker decodes about
8 requests per call, so a server cannot gain more over one-at-a-time serving than the engine gains
from 8-sentence batches over single sentences.

    python3 scripts/bench_batch_gain.py --checkpoint /tmp/bh/checkpoint.pt --model /tmp/bh/int8 \
        --src runs/en-zh/data/test.en --json bench_results/batch_gain.json

(`scripts/bench_http.py --workdir /tmp/bh` leaves the checkpoint and export it served there, with
the peer's decoding settings.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from attn_cli.translator import load_for_decoding, translate


def sentences_per_second(loaded, sentences: list[str], batch: int, repeats: int) -> float:
    """The median over `repeats` of sentences/s translating `sentences` in batches of `batch`."""
    options = loaded.config.decode
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, len(sentences), batch):
            translate(loaded, sentences[i : i + batch], options)
        rates.append(len(sentences) / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint (the PyTorch rows)")
    parser.add_argument("--model", type=Path, help="an `attn export` directory (the CTranslate2 rows)")
    parser.add_argument("--src", type=Path, default=Path("runs/en-zh/data/test.en"))
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="compute threads, as the servers of bench_http.py")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sentences = [line.strip() for line in args.src.read_text(encoding="utf-8").splitlines()][: args.sentences]
    batches = [int(b) for b in args.batches.split(",")]
    engines = []
    if args.checkpoint:
        engines.append(("pytorch", load_for_decoding([], [args.checkpoint], None, "cpu", threads=args.threads)))
    if args.model:
        engines.append(("ct2 int8", load_for_decoding([], [], args.model, "cpu", threads=args.threads)))
    rows = []
    print("| engine | sentences per call | sentences/s | gain over 1 |\n|---|---:|---:|---:|")
    for name, loaded in engines:
        translate(loaded, sentences[:8], loaded.config.decode)  # warm-up
        single = None
        for batch in batches:
            rate = sentences_per_second(loaded, sentences, batch, args.repeats)
            single = single or rate
            rows.append(
                {"engine": name, "batch": batch, "sentences_per_s": round(rate, 1), "gain": round(rate / single, 2)}
            )
            print(f"| {name} | {batch} | {rate:.1f} | {rate / single:.2f}× |", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {"sentences": len(sentences), "repeats": args.repeats, "threads": args.threads, "src": str(args.src)}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
