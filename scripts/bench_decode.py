"""Greedy decoding speed with the KV cache against re-running the decoder on the whole prefix.

Both decoders are the same `greedy_decode` on the same randomly initialised model of the size that
configs/en-zh.yaml names, forced to produce exactly --new-tokens tokens per sentence. Prints a
table of median tokens/s and writes it as JSON.

    python scripts/bench_decode.py                      # en-zh size, batch 1 and 32, 64 tokens
    python scripts/bench_decode.py --repeats 5 --json bench_results/decode.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from attn_cli.config import load_config
from attn_cli.decode import greedy_decode
from attn_cli.model import build_model

REPO = Path(__file__).resolve().parents[1]


def random_sources(batch: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    src = torch.randint(4, vocab, (batch, length), generator=generator)
    src[:, -1] = 3  # EOS
    return src


def time_decoding(model, src: torch.Tensor, new_tokens: int, use_cache: bool, repeats: int) -> list[float]:
    greedy_decode(model, src, use_cache=use_cache, exact_steps=4)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = greedy_decode(model, src, use_cache=use_cache, exact_steps=new_tokens)
        seconds.append(time.perf_counter() - start)
        assert all(len(row) == new_tokens for row in out)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "en-zh.yaml"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--source-length", type=int, default=16, help="source tokens per sentence, EOS included")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=str(REPO / "bench_results" / "decode.json"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.config)
    vocab = cfg.tokenizer.vocab_size
    model = build_model(cfg.model, vocab, vocab).eval()
    generator = torch.Generator().manual_seed(0)

    rows = []
    for batch in args.batch_sizes:
        src = random_sources(batch, args.source_length, vocab, generator)
        result = {"batch": batch, "new_tokens": args.new_tokens}
        for name, use_cache in (("cached", True), ("uncached", False)):
            seconds = statistics.median(time_decoding(model, src, args.new_tokens, use_cache, args.repeats))
            result[f"{name}_tokens_per_s"] = batch * args.new_tokens / seconds
            result[f"{name}_ms_per_sentence"] = 1000 * seconds / batch
        result["speedup"] = result["cached_tokens_per_s"] / result["uncached_tokens_per_s"]
        rows.append(result)

    model_cfg = cfg.model
    print(f"greedy decoding, {model_cfg.d_model}d {model_cfg.encoder_layers}+{model_cfg.decoder_layers} layers, "
          f"vocabulary {vocab}, {args.new_tokens} new tokens, source {args.source_length} tokens, "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"{'batch':>5}  {'cached tok/s':>12}  {'uncached tok/s':>14}  {'cached/uncached':>15}")
    for row in rows:
        print(f"{row['batch']:>5}  {row['cached_tokens_per_s']:>12,.0f}  {row['uncached_tokens_per_s']:>14,.0f}  "
              f"{row['speedup']:>14.2f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "benchmark": "greedy decoding, KV cache vs full prefix",
        "model": {"d_model": model_cfg.d_model, "num_heads": model_cfg.num_heads, "ffn_dim": model_cfg.ffn_dim,
                  "encoder_layers": model_cfg.encoder_layers, "decoder_layers": model_cfg.decoder_layers,
                  "vocab_size": vocab},
        "threads": args.threads, "repeats": args.repeats, "source_length": args.source_length,
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "results": rows,
    }, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
