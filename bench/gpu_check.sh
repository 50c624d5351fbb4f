#!/usr/bin/env bash
# A check of training on a CUDA GPU, in at most 5 minutes: the base size (d_model 512, 8 heads,
# FFN 2048, 6+6 layers, vocabulary 8000) trained for STEPS steps (default 300) on random
# length-bucketed batches of MAX_TOKENS (default 4096) tokens, in bf16 and in fp16 (with loss
# scaling), each with and without gradient checkpointing, through our TrainingStep. For each it
# prints real tokens/s (source + target, padding excluded, after WARMUP steps), the peak CUDA
# memory (torch.cuda.max_memory_allocated), the first and last loss, skipped non-finite steps, and
# which scaled_dot_product_attention kernel ran (from the profiler's op names of one step).
#
#     bash bench/gpu_check.sh
#     STEPS=100 bash bench/gpu_check.sh
#
# On a machine without CUDA it says so and exits with status 0.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export STEPS="${STEPS:-300}" WARMUP="${WARMUP:-20}" MAX_TOKENS="${MAX_TOKENS:-4096}"

exec timeout 290 python3 - <<'EOF'
import os
import random
import sys
import time

import torch

if not torch.cuda.is_available():
    print(f"gpu_check: no CUDA device visible to torch {torch.__version__}; nothing to check on this machine")
    sys.exit(0)

from attn_cli.data.batching import Example, token_batches
from attn_cli.data.collate import collate
from attn_cli.model import Transformer
from attn_cli.training.precision import Precision
from attn_cli.training.setup import inverse_sqrt_schedule
from attn_cli.training.step import TrainingObjective, TrainingStep

STEPS, WARMUP, MAX_TOKENS = int(os.environ["STEPS"]), int(os.environ["WARMUP"]), int(os.environ["MAX_TOKENS"])
if STEPS <= WARMUP:
    sys.exit(f"gpu_check: STEPS ({STEPS}) must be more than WARMUP ({WARMUP}), the untimed steps")
VOCAB = 8000
DEVICE = torch.device("cuda")

# Which fused attention op ran; the math fallback runs as ordinary matmuls and softmax.
SDPA_OPS = {"aten::_scaled_dot_product_flash_attention": "flash",
            "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
            "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
            "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
            "aten::_scaled_dot_product_attention_math": "math"}


def random_batches(count_tokens: int) -> list:
    """Random sentences of 5 to 60 tokens, cut into length-bucketed batches by our batcher."""
    rng = random.Random(0)
    examples, total = [], 0
    while total < count_tokens:
        source, target = rng.randint(5, 60), rng.randint(5, 60)
        examples.append(Example(len(examples), [rng.randrange(4, VOCAB) for _ in range(source)],
                                [rng.randrange(4, VOCAB) for _ in range(target)]))
        total += source + target + 2
    return [collate([examples[p] for p in positions])
            for positions in token_batches(examples, MAX_TOKENS, shuffle=True, seed=1)]


def sdpa_kernels(update, batch) -> str:
    # The aten op a CUDA kernel was launched from is recorded on the CPU side; no CUPTI needed.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        update([batch])
        torch.cuda.synchronize()
    keys = {event.key for event in profiler.key_averages()}
    ran = {SDPA_OPS.get(key, key) for key in keys
           if key.startswith("aten::_scaled_dot_product") and not key.endswith("_backward")}
    if ran:
        return "+".join(sorted(ran))
    # attn_cli's attention bypasses SDPA where its fused kernel is slow (bf16 on the CPU).
    return "SDPA not called (explicit matmul and softmax)" if "aten::softmax" in keys else "none found"


def run(precision_name: str, checkpointing: bool, batches: list) -> None:
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, d_model=512, num_heads=8, ffn_dim=2048, encoder_layers=6, decoder_layers=6,
                        dropout=0.1).to(DEVICE)
    model.gradient_checkpointing = checkpointing
    optimizer = torch.optim.AdamW(model.parameters(), lr=7e-4, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(100))
    precision = Precision(precision_name, "")
    update = TrainingStep(model, TrainingObjective(model, 0.1), optimizer, scheduler, precision.grad_scaler(DEVICE),
                          precision, DEVICE, clip_norm=1.0)
    torch.cuda.reset_peak_memory_stats()
    losses, skipped, tokens, started = [], 0, 0, None
    for step in range(STEPS):
        if step == WARMUP:
            torch.cuda.synchronize()
            started, tokens = time.perf_counter(), 0
        batch = batches[step % len(batches)].to(DEVICE)
        result = update([batch])
        losses.append(result.loss)
        skipped += not result.applied
        tokens += batch.num_source_tokens + batch.num_target_tokens
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20
    kernels = sdpa_kernels(update, batches[0].to(DEVICE))
    print(f"{precision_name:<5} {str(checkpointing):<9} {tokens / seconds:>10,.0f} {peak:>10,.0f} "
          f"{losses[0]:>7.3f} {losses[-1]:>7.3f} {skipped:>7} {kernels}", flush=True)
    del model, optimizer, update
    torch.cuda.empty_cache()


print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"SDPA backends enabled: flash {torch.backends.cuda.flash_sdp_enabled()}, "
      f"memory-efficient {torch.backends.cuda.mem_efficient_sdp_enabled()}, "
      f"cuDNN {torch.backends.cuda.cudnn_sdp_enabled()}, math {torch.backends.cuda.math_sdp_enabled()}")
batches = random_batches(MAX_TOKENS * 64)
print(f"base size, {STEPS} steps ({WARMUP} warm-up untimed), {len(batches)} batches of up to {MAX_TOKENS:,} tokens")
print(f"{'prec':<5} {'grad ckpt':<9} {'tok/s':>10} {'peak MiB':>10} {'loss0':>7} {'loss':>7} {'skipped':>7} sdpa kernel")
for precision_name in ("bf16", "fp16"):
    for checkpointing in (False, True):
        run(precision_name, checkpointing, batches)
EOF
