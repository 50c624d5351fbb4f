"""How much a decoding engine gains from batching alone, without HTTP: sentences/s translating the
test split in batches of 1, 8 and 32 sentences through the translation pipeline
(`attn_cli.decoding.pipeline.translate`, what the `attn serve` model worker calls), for a checkpoint
(PyTorch) and an `attn export` (CTranslate2).

It bounds what batching across requests can give a server: at 16 clients the worker decodes about
8 requests per call, so a server cannot gain more over one-at-a-time serving than the engine gains
from 8-sentence batches over single sentences.

Each engine is warmed up on 8 sentences, then its batch sizes are timed in alternation, --repeats
rounds (each round translates every sentence once per batch size); a figure is the median rate.

    python3 -m bench.batch_gain --checkpoint /tmp/bh/http/checkpoint.pt --model /tmp/bh/http/int8 \\
        --src runs/en-zh/data/test.en --json bench_results/batch_gain.json

(`python3 -m bench.http --workdir /tmp/bh` leaves the checkpoint and export it served in
/tmp/bh/http/, with the peer's decoding settings.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.toolkit import alternate, attn, markdown_table, median, parser, tiny_run, write_report


def main() -> None:
    arguments = parser(
        __doc__, "a tiny run's checkpoint and its int8 export, 16 test sentences in batches of 1 and 8, one round"
    )
    arguments.add_argument("--checkpoint", type=Path, help="a checkpoint (the PyTorch rows)")
    arguments.add_argument("--model", type=Path, help="an `attn export` directory (the CTranslate2 rows)")
    arguments.add_argument("--src", type=Path, default=Path("runs/en-zh/data/test.en"))
    arguments.add_argument("--sentences", type=int, default=256)
    arguments.add_argument("--batches", default="1,8,32")
    arguments.add_argument("--repeats", type=int, default=3)
    arguments.add_argument("--threads", type=int, default=1, help="compute threads, as the servers of bench.http")
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench")
    args = arguments.parse_args()
    if args.smoke:
        run = tiny_run(args.workdir / "tiny")
        args.checkpoint = args.checkpoint or run / "checkpoints" / "best.pt"
        if args.model is None:
            args.model = args.workdir / "batch_gain" / "int8"
            if not (args.model / "model.bin").is_file():
                attn("export", "--checkpoint", args.checkpoint, "--output", args.model)
        args.src, args.sentences, args.batches, args.repeats = run / "data" / "test.en", 16, "1,8", 1
    if args.checkpoint is None and args.model is None:
        arguments.error("give --checkpoint, --model or both (or --smoke)")

    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    sentences = [line.strip() for line in args.src.read_text(encoding="utf-8").splitlines()][: args.sentences]
    batches = [int(b) for b in args.batches.split(",")]
    engines = []
    if args.checkpoint:
        engines.append(("pytorch", load_engine([], [args.checkpoint], None, "cpu", threads=args.threads)))
    if args.model:
        engines.append(("ct2 int8", load_engine([], [], args.model, "cpu", threads=args.threads)))

    def translate_in_batches(engine, batch: int):
        def call() -> None:
            for i in range(0, len(sentences), batch):
                translate(engine, [Source(text) for text in sentences[i : i + batch]], engine.config.decode)

        return call

    rows = []
    for name, engine in engines:
        translate(engine, [Source(text) for text in sentences[:8]], engine.config.decode)  # warm-up
        seconds = alternate(
            {batch: translate_in_batches(engine, batch) for batch in batches}, args.repeats, warmup=False
        )
        single = None
        for batch in batches:
            rate = median([len(sentences) / s for s in seconds[batch]])
            single = single or rate
            rows.append(
                {"engine": name, "batch": batch, "sentences_per_s": round(rate, 1), "gain": round(rate / single, 2)}
            )
    print(
        markdown_table(
            ["engine", "sentences per call", "sentences/s", "gain over 1"],
            [[row["engine"], row["batch"], row["sentences_per_s"], f"{row['gain']:.2f}×"] for row in rows],
        )
    )
    settings = {"sentences": len(sentences), "repeats": args.repeats, "threads": args.threads, "src": str(args.src)}
    write_report(args.json, {"settings": settings, "rows": rows}, args)


if __name__ == "__main__":
    main()
