"""Training speed and memory of our Transformer against Hugging Face Transformers (MarianMTModel).

Three parts, each selectable with --parts:

  step    Target tokens/s of one training step (forward, backward, clipping, AdamW) of ours and of a
          MarianMTModel of the same dimensions, on the same random batches, in fp32, bf16 or fp16
          (torch.autocast for both; fp16 with a gradient scaler each), with or without gradient
          checkpointing, on the CPU or a GPU (--device cuda), medians after warm-up, the two taking
          steps in turn. Both minimise the same
          label-smoothed loss: Transformers through its logits and F.cross_entropy, ours as
          `attn train` does, through TrainingObjective, whose loss projects the hidden states
          chunk by chunk without building the logits. Also model FLOP utilisation:
          the step's FLOPs (formula below) per second, as a share of a square matmul's FLOP/s in the
          same precision on the same device (2048 on the CPU, 8192 on a GPU), measured in the same run.
  epoch   One epoch of the Tatoeba corpus with the data and tokenizer settings of configs/en-zh.yaml:
          ours (length-bucketed token batches of train.max_tokens, our TrainingStep, bf16) against
          Seq2SeqTrainer as users run it (group_by_length, 64 sentences per batch, bf16, no
          evaluation or saving). Both count real tokens/s: source plus target tokens, padding excluded.
  memory  Peak resident memory of training steps of the base size with and without gradient
          checkpointing, and the time of a step; one fresh subprocess per configuration, whose
          peak resident memory (VmHWM) after setup and after the steps is read; then the peak
          of live tensor bytes during one more step, from the profiler's allocation records.
  loss    The loss alone, forward and backward, at each size's step shape: our projected loss
          (attn_cli/training/loss.py) against the logits and F.cross_entropy, alternating, fp32 and bf16.

Step FLOPs, for B rows of S source and T target tokens, model width d, FFN width f, vocabulary V,
Le encoder and Ld decoder layers (forward = 2 x multiply-adds; a training step = 3 x forward):
    linear     B*S*Le*(4d^2 + 2df) + B*T*Ld*(6d^2 + 2df) + B*S*Ld*2d^2 + B*T*d*V
    attention  B*Le*2*S^2*d + B*Ld*2*T^2*d + B*Ld*2*T*S*d        (scores and weighted sums, causal unhalved)
    FLOPs = 6 * (linear + attention)
(decoder per target token: self-attention q, k, v, out (4d^2), cross-attention q and out (2d^2), FFN;
cross-attention keys and values are projected from the source tokens, 2d^2 each per decoder layer.)

Writes everything as JSON (by default bench_results/train.json).

    python3 -m bench.train                                      # everything; minutes on 2 cores
    python3 -m bench.train --parts step --sizes small --steps 2 --warmup 1 --target-tokens 256   # a quick run
    python3 -m bench.train --parts epoch --epoch-fraction 0.05  # 5% of the epoch for each system
    python3 -m bench.train --parts memory --memory-steps 3
    python3 -m bench.train --profile base fp32                  # where our step's time goes
    python3 -m bench.train --parts step --tune-malloc           # no system pays page faults per step
    python3 -m bench.train --parts step --device cuda --sizes base big --precisions fp32 bf16 fp16 \
        --checkpointing off on --target-tokens 25000             # on a GPU
    python3 -m bench.train --smoke --json /tmp/train.json       # every part, tiny: checks that it runs
Needs `pip install -e ".[bench]"` (transformers and accelerate, which Seq2SeqTrainer needs).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import MarianMTModel

from attn_cli.config import load_config
from attn_cli.data.batching import Example, filter_by_length, token_batches
from attn_cli.data.collate import collate
from attn_cli.data.prepare import encode_pairs, read_split, train_or_load_tokenizers
from attn_cli.model import Transformer, build_model
from attn_cli.training.loss import label_smoothed_loss, projected_label_smoothed_loss
from attn_cli.training.precision import Precision
from attn_cli.training.setup import inverse_sqrt_schedule
from attn_cli.training.step import TrainingObjective, TrainingStep, adamw
from attn_cli.vocab import EOS_ID, PAD_ID
from bench.toolkit import (
    REPO,
    alternate,
    attn_model,
    marian_like,
    markdown_table,
    median,
    parser,
    tiny_run,
    write_report,
)

VOCAB = 8000
SIZES = {
    "small": {"d_model": 256, "num_heads": 4, "ffn_dim": 1024, "layers": 3, "target_tokens": 4096},
    "base": {"d_model": 512, "num_heads": 8, "ffn_dim": 2048, "layers": 6, "target_tokens": 2048},
    "big": {"d_model": 1024, "num_heads": 16, "ffn_dim": 4096, "layers": 6, "target_tokens": 2048},
}
PRECISIONS = ("fp32", "bf16", "fp16")  # fp16 with a gradient scaler, for both systems
DROPOUT = 0.1
LABEL_SMOOTHING = 0.1
CLIP_NORM = 1.0
# The AdamW settings of the timed steps, for both systems: PyTorch's defaults.
BETAS, WEIGHT_DECAY = (0.9, 0.999), 0.01


# --- models


def build_ours(dims: dict, dropout: float = DROPOUT, vocab: int = VOCAB) -> Transformer:
    return attn_model(dims, vocab, dropout).train()


def build_marian(dims: dict, dropout: float = DROPOUT, vocab: int = VOCAB) -> MarianMTModel:
    """The peer of attn's size (`toolkit.marian_like`), in training mode. It stays post-LN (ours is pre-LN)."""
    return marian_like(dims, vocab, dropout).train()


def marian_loss(model: MarianMTModel, batch) -> torch.Tensor:
    """Transformers' logits, then our label-smoothed loss in fp32 (F.cross_entropy over the logits)."""
    logits = model(
        input_ids=batch.src,
        attention_mask=batch.src != PAD_ID,
        decoder_input_ids=batch.tgt_in,
        decoder_attention_mask=batch.tgt_in != PAD_ID,
    ).logits
    return label_smoothed_loss(logits, batch.tgt_out, LABEL_SMOOTHING)[0]


def ours_loss(model: Transformer, batch) -> torch.Tensor:
    """Our training forward as `attn train` runs it: the loss projects the hidden states itself."""
    return TrainingObjective(model, LABEL_SMOOTHING)(batch.src, batch.tgt_in, batch.tgt_out)


# --- part 1: one training step


def random_batches(count: int, rows: int, length: int, seed: int = 0) -> list:
    """Unpadded batches of random ids (EOS last): every position is a real token, so FLOPs per token are exact."""
    generator = torch.Generator().manual_seed(seed)

    def examples():
        return [
            Example(
                i,
                torch.randint(4, VOCAB, (length - 1,), generator=generator).tolist(),
                torch.randint(4, VOCAB, (length - 1,), generator=generator).tolist(),
            )
            for i in range(rows)
        ]

    return [collate(examples()) for _ in range(count)]


def step_flops(size: str, rows: int, source: int, target: int) -> float:
    """Training FLOPs of one step; see the module docstring for the formula."""
    dims = SIZES[size]
    d, f, layers = dims["d_model"], dims["ffn_dim"], dims["layers"]
    linear = (
        rows * source * layers * (4 * d * d + 2 * d * f)
        + rows * target * layers * (6 * d * d + 2 * d * f)
        + rows * source * layers * 2 * d * d
        + rows * target * d * VOCAB
    )
    attention = rows * layers * 2 * d * (source * source + target * target + target * source)
    return 6.0 * (linear + attention)


CPU = torch.device("cpu")


def one_step(
    model: torch.nn.Module,
    loss_of,
    optimizer: torch.optim.Optimizer,
    batch,
    precision: Precision,
    device: torch.device = CPU,
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """The step both systems take: forward under autocast, the label-smoothed loss (softmax in
    fp32) per target token, backward, gradient clipping, AdamW; in fp16 through `scaler`, the
    system's own gradient scaler (a disabled one scales nothing)."""
    scaler = scaler or precision.grad_scaler(device)
    with precision.autocast(device):
        loss_sum = loss_of(model, batch)
    scaler.scale(loss_sum / batch.num_target_tokens).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def time_steps_alternating(
    systems: dict,
    batches,
    precision: Precision,
    warmup: int,
    steps: int,
    page_faults: dict | None = None,
    device: torch.device = CPU,
) -> dict:
    """Seconds per step of each system: `warmup` untimed steps each, then `steps` rounds in which
    every system takes one timed step in turn (`toolkit.alternate`), so that a slow spell of the
    shared machine falls on all of them rather than on one. `systems` maps a name to (model,
    loss_of). `page_faults`, when given, receives each timed step's minor page faults (memory the
    process touched for the first time since the system handed it out: fresh allocations the
    allocator mapped from the OS). On a GPU each timed step ends when the device has finished it."""
    # Both take the fused AdamW: attn's trainer uses it, and so does Transformers' Trainer by default.
    optimizers = {name: adamw(model.parameters(), 1e-4, BETAS, WEIGHT_DECAY) for name, (model, _) in systems.items()}
    scalers = {name: precision.grad_scaler(device) for name in systems}

    def step_of(name: str, batch) -> None:
        model, loss_of = systems[name]
        one_step(model, loss_of, optimizers[name], batch, precision, device, scalers[name])
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for index in range(warmup):
        for name in systems:
            step_of(name, batches[index % len(batches)])

    def timed_step(name: str):
        taken = itertools.count()  # the timed steps take the batches in turn, as the warm-up did

        def step() -> None:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step_of(name, batches[next(taken) % len(batches)])
            if page_faults is not None:
                page_faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)

        return step

    return alternate({name: timed_step(name) for name in systems}, steps, warmup=False)


def tune_malloc() -> None:
    """glibc maps each block above its mmap threshold (at most 32 MB by default) fresh from the
    system and unmaps it when freed, so a step that allocates such blocks faults their pages in
    again every time; freed heap memory above the trim threshold is returned to the system too.
    Raising both keeps freed memory in the process for reuse."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameters, from glibc's malloc.h
    if not (libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 31)):
        raise SystemExit("--tune-malloc: glibc's mallopt refused the thresholds")


def matmul_peak(precision: str, repeats: int = 10, device: torch.device = CPU) -> float:
    """FLOP/s of a square matmul in this precision (2048 on the CPU, 8192 on a GPU, which 2048 does
    not fill): the peak the FLOP utilisation is a share of."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    n = 8192 if device.type == "cuda" else 2048
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    seconds = []
    for index in range(repeats + 2):  # two untimed
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= 2:
            seconds.append(time.perf_counter() - started)
    return 2 * n**3 / median(seconds)


def bench_step(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    peaks = {precision: matmul_peak(precision, 1 if args.smoke else 10, device) for precision in args.precisions}
    rows_out = []
    for size, precision, checkpointing in itertools.product(args.sizes, args.precisions, args.checkpointing):
        rows = max(1, (args.target_tokens or SIZES[size]["target_tokens"]) // args.length)
        batches = [batch.to(device) for batch in random_batches(4, rows, args.length)]
        flops = step_flops(size, rows, args.length, args.length)
        row = {
            "size": size,
            "precision": precision,
            "checkpointing": checkpointing == "on",
            "device": str(device),
            "rows": rows,
            "length": args.length,
            "target_tokens_per_step": rows * args.length,
            "step_flops": flops,
        }
        ours, hf = build_ours(SIZES[size]).to(device), build_marian(SIZES[size]).to(device)
        if checkpointing == "on":  # recompute each layer's activations in the backward
            ours.gradient_checkpointing = True
            hf.gradient_checkpointing_enable()
        systems = {"ours": (ours, ours_loss), "hf": (hf, marian_loss)}
        faults: dict[str, list[int]] = {}
        timings = time_steps_alternating(
            systems, batches, Precision(precision, ""), args.warmup, args.steps, faults, device
        )
        for name, (model, _) in systems.items():
            seconds = median(timings[name])
            row[name] = {
                "seconds_per_step": seconds,
                "target_tokens_per_second": rows * args.length / seconds,
                "flops_per_second": flops / seconds,
                "mfu": flops / seconds / peaks[precision],
                "parameters": sum(p.numel() for p in model.parameters()),
                "minor_page_faults_per_step": median(faults[name]),
            }
            print(
                f"  step {size} {precision} checkpointing {checkpointing} {name}: "
                f"{row[name]['target_tokens_per_second']:,.0f} target tok/s, {100 * row[name]['mfu']:.1f}% of the "
                f"measured {precision} matmul rate",
                flush=True,
            )
        del systems, ours, hf
        if device.type == "cuda":
            torch.cuda.empty_cache()
        row["ours_over_hf"] = row["ours"]["target_tokens_per_second"] / row["hf"]["target_tokens_per_second"]
        rows_out.append(row)
    print(
        f"\ntraining step: median of {args.steps} after {args.warmup} warm-up, ours and HF alternating step by step, "
        f"{args.threads} threads, "
        + (f"on {torch.cuda.get_device_name(device)}, " if device.type == "cuda" else "")
        + f"random unpadded batches of {args.length}-token sentences; ratio > 1: ours is faster"
    )
    print("matmul peak: " + ", ".join(f"{p} {v / 1e9:,.1f} GFLOP/s" for p, v in peaks.items()))
    headers = ["size", "prec", "ckpt", "ours tok/s", "HF tok/s", "ours/HF", "ours GFLOP/s", "HF GFLOP/s"]
    headers += ["ours MFU %", "HF MFU %", "ours faults", "HF faults"]
    table = [
        [
            row["size"],
            row["precision"],
            "on" if row["checkpointing"] else "off",
            round(row["ours"]["target_tokens_per_second"]),
            round(row["hf"]["target_tokens_per_second"]),
            round(row["ours_over_hf"], 2),
            round(row["ours"]["flops_per_second"] / 1e9, 1),
            round(row["hf"]["flops_per_second"] / 1e9, 1),
            round(100 * row["ours"]["mfu"], 1),
            round(100 * row["hf"]["mfu"], 1),
            round(row["ours"]["minor_page_faults_per_step"]),
            round(row["hf"]["minor_page_faults_per_step"]),
        ]
        for row in rows_out
    ]
    print(markdown_table(headers, table))
    if args.tune_malloc:
        print("glibc malloc tuned (--tune-malloc): mmap and trim thresholds raised")
    return {
        "matmul_peak_flops_per_second": peaks,
        "malloc_tuned": args.tune_malloc,
        "results": rows_out,
        "flops_formula": "6 * (linear + attention), see bench/train.py",
    }


# --- part 2: one epoch of Tatoeba


def tatoeba_examples(args: argparse.Namespace):
    """The training pairs of configs/en-zh.yaml (--smoke: tiny.yaml), encoded with its tokenizer
    (trained once into --tokenizer-dir and reused) and length-filtered as training does."""
    cfg = load_config(REPO / "configs" / args.epoch_config, [f"run_dir={args.tokenizer_dir}"])
    cwd = os.getcwd()
    os.chdir(REPO)  # the corpus path is relative to the repository root
    try:
        split = read_split(cfg, print)
        tokenizers = train_or_load_tokenizers(cfg, split, print)
        examples = encode_pairs(list(split.train_pairs()), tokenizers)
    finally:
        os.chdir(cwd)
    examples, _ = filter_by_length(
        examples, cfg.data.max_source_tokens, cfg.data.max_target_tokens, cfg.data.max_length_ratio
    )
    return cfg, examples, tokenizers.source.vocab_size


def ours_epoch(cfg, examples: list[Example], vocab: int, fraction: float) -> dict:
    """Our length-bucketed token batches and TrainingStep, bf16, for `fraction` of an epoch."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, vocab, vocab)
    optimizer = adamw(model.parameters(), cfg.train.lr, cfg.train.betas, cfg.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(cfg.train.warmup_steps))
    precision = Precision("bf16", "")
    cpu = torch.device("cpu")
    update = TrainingStep(
        model,
        TrainingObjective(model, cfg.train.label_smoothing),
        optimizer,
        scheduler,
        precision.grad_scaler(cpu),
        precision,
        cpu,
        cfg.train.clip_norm,
    )
    batches = token_batches(examples, cfg.train.max_tokens, shuffle=True, seed=cfg.train.seed, epoch=1)
    batches = batches[: max(1, math.ceil(fraction * len(batches)))]
    tokens = 0
    started = time.perf_counter()
    for positions in batches:
        batch = collate([examples[p] for p in positions])
        update([batch])
        tokens += batch.num_source_tokens + batch.num_target_tokens
    seconds = time.perf_counter() - started
    return {
        "batches": len(batches),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "batching": f"token budget train.max_tokens={cfg.train.max_tokens}, length-bucketed",
    }


class _CountingCollator:
    """Does what DataCollatorForSeq2Seq given the model does (inputs padded with the pad id, labels
    with -100, decoder inputs from the model's label shift) and counts the real source and target
    tokens it hands out."""

    def __init__(self, model: MarianMTModel) -> None:
        self.model = model
        self.tokens = 0

    def __call__(self, features: list[dict]) -> dict:
        source = max(len(f["input_ids"]) for f in features)
        target = max(len(f["labels"]) for f in features)
        input_ids = torch.full((len(features), source), PAD_ID, dtype=torch.long)
        labels = torch.full((len(features), target), -100, dtype=torch.long)
        for row, feature in enumerate(features):
            input_ids[row, : len(feature["input_ids"])] = torch.tensor(feature["input_ids"])
            labels[row, : len(feature["labels"])] = torch.tensor(feature["labels"])
            self.tokens += len(feature["input_ids"]) + len(feature["labels"])
        return {
            "input_ids": input_ids,
            "attention_mask": input_ids != PAD_ID,
            "labels": labels,
            "decoder_input_ids": self.model.prepare_decoder_input_ids_from_labels(labels=labels),
        }


def _group_by_length() -> dict:
    """Transformers 5 replaced group_by_length=True with train_sampling_strategy="group_by_length"."""
    from transformers import Seq2SeqTrainingArguments

    fields = Seq2SeqTrainingArguments.__dataclass_fields__
    if "train_sampling_strategy" in fields:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}


def hf_epoch(cfg, examples: list[Example], vocab: int, fraction: float, workdir: Path) -> dict:
    """Seq2SeqTrainer on the same token ids (source + EOS, target + EOS), as users run it."""
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    dims = {
        "d_model": cfg.model.d_model,
        "num_heads": cfg.model.num_heads,
        "ffn_dim": cfg.model.ffn_dim,
        "layers": cfg.model.encoder_layers,
    }
    model = build_marian(dims, dropout=cfg.model.dropout, vocab=vocab)
    dataset = Dataset.from_dict(
        {"input_ids": [e.src + [EOS_ID] for e in examples], "labels": [e.tgt + [EOS_ID] for e in examples]}
    )
    batch_size = 64
    steps = max(1, math.ceil(fraction * math.ceil(len(examples) / batch_size)))
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(workdir / "hf"),
        per_device_train_batch_size=batch_size,
        **_group_by_length(),
        bf16=True,
        use_cpu=True,
        max_steps=steps,
        learning_rate=cfg.train.lr,
        warmup_steps=cfg.train.warmup_steps,
        label_smoothing_factor=cfg.train.label_smoothing,
        max_grad_norm=cfg.train.clip_norm,
        eval_strategy="no",
        save_strategy="no",
        dataloader_num_workers=0,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        seed=cfg.train.seed,
    )
    collator = _CountingCollator(model)
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=dataset, data_collator=collator)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    return {
        "batches": steps,
        "tokens": collator.tokens,
        "seconds": seconds,
        "tokens_per_second": collator.tokens / seconds,
        "batching": f"{batch_size} sentences, group_by_length",
    }


def bench_epoch(args: argparse.Namespace) -> dict:
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:  # Seq2SeqTrainer refuses to start without it
        reason = "Transformers' Seq2SeqTrainer needs accelerate>=1.1: pip install -e '.[bench]'"
        print(f"\none epoch: not run; {reason}")
        return {"error": reason}
    cfg, examples, vocab = tatoeba_examples(args)
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_train_", dir=args.workdir) as workdir:
        results = {
            "ours": ours_epoch(cfg, examples, vocab, args.epoch_fraction),
            "hf": hf_epoch(cfg, examples, vocab, args.epoch_fraction, Path(workdir)),
        }
    total_tokens = sum(len(e.src) + len(e.tgt) + 2 for e in examples)
    for result in results.values():
        result["projected_epoch_seconds"] = total_tokens / result["tokens_per_second"]
    print(
        f"\none epoch of Tatoeba ({len(examples):,} pairs, {total_tokens:,} real tokens, model "
        f"d{cfg.model.d_model} {cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers, bf16, dropout "
        f"{cfg.model.dropout}), {args.epoch_fraction:.1%} of it run, epoch time projected; "
        "real tokens = source + target, no padding"
    )
    table = [
        [
            name,
            result["batching"],
            result["batches"],
            round(result["tokens_per_second"]),
            round(result["projected_epoch_seconds"]),
        ]
        for name, result in results.items()
    ]
    print(markdown_table(["system", "batching", "batches", "tok/s", "epoch s"], table))
    ratio = results["ours"]["tokens_per_second"] / results["hf"]["tokens_per_second"]
    print(f"ours/HF: {ratio:.2f}x")
    return {
        "pairs": len(examples),
        "real_tokens": total_tokens,
        "fraction": args.epoch_fraction,
        "results": results,
        "ours_over_hf": ratio,
    }


# --- part 3: memory with and without gradient checkpointing


def peak_resident_kib(field: str = "VmHWM") -> int:
    """This process's peak (VmHWM) or current (VmRSS) resident memory. Not ru_maxrss: a child
    started by fork and exec inherits its parent's ru_maxrss, which here was already larger than
    any training step."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # not Linux: the best available


def start_peak_measurement() -> int:
    """Return freed memory to the system and restart the peak (Linux: clear_refs 5 resets VmHWM);
    returns the resident memory it starts from, or -1 where the peak cannot be reset."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed blocks resident otherwise
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return -1
    return peak_resident_kib("VmRSS")


def live_tensor_peak_bytes(step) -> int:
    """The peak of the bytes of live tensors during `step()` above what was live before it: every
    allocation and free the profiler records, in order (the CPU analogue of
    torch.cuda.max_memory_allocated). Unlike the resident memory, it leaves out what the allocator
    keeps after a free or loses to fragmentation."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    changes = sorted(
        (event.start_ns(), event.nbytes())
        for event in profiler.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


def memory_child(size: str, precision: str, checkpointing: bool, steps: int, length: int, target_tokens: int) -> None:
    """Runs in its own process: prints one JSON line with the peak resident memory after setup, after
    the first step (which also creates the gradients and AdamW's moments), and the peak of the
    later, steady-state steps above the memory they start from (activations and transients)."""
    model = build_ours(SIZES[size])
    model.gradient_checkpointing = checkpointing
    rows = max(1, target_tokens // length)
    batch = random_batches(1, rows, length)[0]
    optimizer = adamw(model.parameters(), 1e-4, BETAS, WEIGHT_DECAY)
    setup_kib = peak_resident_kib()
    seconds = []
    for step in range(steps):
        if step == 1:
            peak_kib = peak_resident_kib()
            steady_from_kib = start_peak_measurement()
        started = time.perf_counter()
        one_step(model, ours_loss, optimizer, batch, Precision(precision, ""))
        seconds.append(time.perf_counter() - started)
    steady_peak_kib = peak_resident_kib()
    steady_mib = (steady_peak_kib - steady_from_kib) / 1024 if steps > 1 and steady_from_kib >= 0 else None
    live_mib = (
        live_tensor_peak_bytes(lambda: one_step(model, ours_loss, optimizer, batch, Precision(precision, ""))) / 2**20
    )
    print(
        json.dumps(
            {
                "setup_mib": setup_kib / 1024,
                "peak_mib": max(peak_kib, steady_peak_kib) / 1024,
                "steady_step_mib": steady_mib,
                "live_tensor_step_mib": live_mib,
                "first_step_seconds": seconds[0],
                "step_seconds": median(seconds[1:]) if len(seconds) > 1 else seconds[0],
            }
        )
    )


def bench_memory(args: argparse.Namespace) -> dict:
    rows_out = []
    for precision in args.precisions:
        for checkpointing in (False, True):
            command = [
                sys.executable,
                "-m",
                "bench.train",
                "--memory-child",
                args.memory_size,
                precision,
                "1" if checkpointing else "0",
                "--memory-steps",
                str(args.memory_steps),
                "--length",
                str(args.length),
                "--threads",
                str(args.threads),
            ]
            if args.target_tokens:
                command += ["--target-tokens", str(args.target_tokens)]
            output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO).stdout
            row = {
                "size": args.memory_size,
                "precision": precision,
                "gradient_checkpointing": checkpointing,
                **json.loads(output.strip().splitlines()[-1]),
            }
            row["step_mib"] = row["peak_mib"] - row["setup_mib"]
            rows_out.append(row)
            print(f"  memory {precision} checkpointing={checkpointing}: peak {row['peak_mib']:,.0f} MiB", flush=True)
    print(
        f"\nmemory of {args.memory_steps} training steps, {args.memory_size} size, "
        f"{args.target_tokens or SIZES[args.memory_size]['target_tokens']} target tokens per batch, "
        f"{args.length}-token sentences; a fresh process each, peak resident memory (VmHWM)"
    )
    headers = ["prec", "grad ckpt", "setup MiB", "peak MiB", "step MiB", "steady MiB", "tensors MiB", "s/step"]
    table = [
        [
            row["precision"],
            str(row["gradient_checkpointing"]),
            round(row["setup_mib"]),
            round(row["peak_mib"]),
            round(row["step_mib"]),
            None if row["steady_step_mib"] is None else round(row["steady_step_mib"]),
            round(row["live_tensor_step_mib"]),
            round(row["step_seconds"], 2),
        ]
        for row in rows_out
    ]
    print(markdown_table(headers, table))
    print(
        "steady: a later step's resident peak above its start; "
        "tensors: the live-tensor peak of one more step above its start"
    )
    return {
        "measure": "peak resident memory (VmHWM) of a fresh process: "
        "after building model, batch and optimizer (setup), and "
        "after the steps (peak); step_mib = peak - setup (activations, gradients, AdamW state); "
        "steady_step_mib = the peak of the steps after the first above the resident memory "
        "they start from, after freed memory is returned (activations and transients); "
        "live_tensor_step_mib = the peak of live tensor bytes during one more step above those "
        "live before it (torch.profiler's allocation records)",
        "results": rows_out,
    }


# --- part 4: the loss alone


def bench_loss(args: argparse.Namespace) -> dict:
    """Forward and backward of the label-smoothed loss from (tokens, d_model) hidden states and the
    (V, d_model) output matrix, median of --steps after --warmup, the two ways taking turns."""
    ways = {
        "logits": lambda h, w, y: label_smoothed_loss(h @ w.t(), y, LABEL_SMOOTHING)[0],
        "projected": lambda h, w, y: projected_label_smoothed_loss(h, w, y, LABEL_SMOOTHING),
    }
    rows_out = []
    for size, precision in itertools.product(args.sizes, args.precisions):
        tokens = args.target_tokens or SIZES[size]["target_tokens"]
        generator = torch.Generator().manual_seed(0)
        hidden = torch.randn(1, tokens, SIZES[size]["d_model"], generator=generator, requires_grad=True)
        weight = (torch.randn(VOCAB, SIZES[size]["d_model"], generator=generator) * 0.05).requires_grad_()
        labels = torch.randint(4, VOCAB, (1, tokens), generator=generator)

        def forward_backward(loss_of, hidden=hidden, weight=weight, labels=labels, precision=precision):
            def run() -> None:
                hidden.grad = weight.grad = None
                with Precision(precision, "").autocast(torch.device("cpu")):
                    loss = loss_of(hidden, weight, labels)
                loss.backward()

            return run

        calls = {name: forward_backward(loss_of) for name, loss_of in ways.items()}
        for _ in range(args.warmup):
            for call in calls.values():
                call()
        seconds = alternate(calls, args.steps, warmup=False)
        row = {
            "size": size,
            "precision": precision,
            "tokens": tokens,
            "vocab": VOCAB,
            **{name: median(times) for name, times in seconds.items()},
        }
        row["logits_over_projected"] = row["logits"] / row["projected"]
        rows_out.append(row)
    print(
        f"\nloss forward + backward, median of {args.steps} after {args.warmup} warm-up, alternating, "
        f"vocabulary {VOCAB}, {args.threads} threads"
    )
    table = [
        [
            row["size"],
            row["precision"],
            row["tokens"],
            round(row["logits"], 3),
            round(row["projected"], 3),
            round(row["logits_over_projected"], 2),
        ]
        for row in rows_out
    ]
    print(markdown_table(["size", "prec", "tokens", "logits s", "projected s", "speed-up"], table))
    return {"results": rows_out}


def profile_step(args: argparse.Namespace) -> None:
    """Our training step under torch.profiler: 3 steps after --warmup, the top ops by self CPU time,
    and the share of matrix products (mm, addmm, addmm_) in all of it."""
    size, precision = args.profile
    rows = max(1, (args.target_tokens or SIZES[size]["target_tokens"]) // args.length)
    batches = random_batches(4, rows, args.length)
    model = build_ours(SIZES[size])
    optimizer = adamw(model.parameters(), 1e-4, BETAS, WEIGHT_DECAY)
    for index in range(args.warmup):
        one_step(model, ours_loss, optimizer, batches[index % len(batches)], Precision(precision, ""))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for index in range(3):
            one_step(model, ours_loss, optimizer, batches[index % len(batches)], Precision(precision, ""))
    events = profiler.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=15))
    total = sum(event.self_cpu_time_total for event in events)
    matmul = sum(
        event.self_cpu_time_total for event in events if event.key in ("aten::mm", "aten::addmm", "aten::addmm_")
    )
    print(
        f"{size} {precision}: matrix products {matmul / 1e6 / 3:.2f} s of {total / 1e6 / 3:.2f} s per step "
        f"({matmul / total:.0%}), self CPU time under the profiler"
    )


# --- report


def main() -> None:
    arguments = parser(
        __doc__,
        "every part at the small size in bf16, 64 target tokens of 16-token sentences per batch, one "
        "warm-up and one timed step; the epoch part on tiny.yaml's data and model with the tiny run's tokenizer, 10%% "
        "of its epoch; memory of the small size, 2 steps",
    )
    arguments.add_argument(
        "--parts", nargs="+", choices=["step", "epoch", "memory", "loss"], default=["step", "epoch", "memory", "loss"]
    )
    arguments.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["small", "base"])
    arguments.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["fp32", "bf16"])
    arguments.add_argument(
        "--checkpointing", nargs="+", choices=["off", "on"], default=["off"], help="gradient checkpointing (step part)"
    )
    arguments.add_argument("--device", default="cpu", help="where the step part runs: cpu, or cuda (that part only)")
    arguments.add_argument("--steps", type=int, default=10, help="timed steps per case; the median counts")
    arguments.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    arguments.add_argument(
        "--length", type=int, default=32, help="source and target tokens per random sentence, EOS included"
    )
    arguments.add_argument("--threads", type=int, default=2)
    arguments.add_argument(
        "--target-tokens",
        type=int,
        help="target tokens per random batch (default: 4096 small, 2048 base); small values make a quick run",
    )
    arguments.add_argument("--epoch-fraction", type=float, default=1.0, help="run this share of the epoch (0 < x <= 1)")
    arguments.add_argument(
        "--tokenizer-dir",
        default=str(REPO / "bench_results" / "tatoeba-tokenizer"),
        help="where the en-zh tokenizer is trained once and reused",
    )
    arguments.add_argument("--memory-size", choices=list(SIZES), default="base")
    arguments.add_argument(
        "--memory-steps", type=int, default=3, help="steps per memory measurement (the first counts too)"
    )
    arguments.add_argument(
        "--memory-child", nargs=3, metavar=("SIZE", "PRECISION", "CHECKPOINTING"), help=argparse.SUPPRESS
    )
    arguments.add_argument(
        "--tune-malloc",
        action="store_true",
        help="raise glibc's mmap and trim thresholds first, so that no system pays page faults "
        "for memory the allocator maps and returns every step (the step part counts them)",
    )
    arguments.add_argument(
        "--profile",
        nargs=2,
        metavar=("SIZE", "PRECISION"),
        help="only profile 3 of our training steps, e.g. --profile base fp32",
    )
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench",
        help="where Seq2SeqTrainer writes (a temporary directory in it, removed after), and --smoke's tiny run",
    )
    args = arguments.parse_args()
    if not 0 < args.epoch_fraction <= 1:
        arguments.error("--epoch-fraction must be in (0, 1]")
    if args.device != "cpu" and args.parts != ["step"]:
        arguments.error(f"--device {args.device} times the step part alone: add --parts step")
    args.epoch_config = "en-zh.yaml"
    if args.smoke and not args.memory_child:
        args.sizes, args.precisions, args.memory_size, args.memory_steps = ["small"], ["bf16"], "small", 2
        args.steps, args.warmup, args.length, args.target_tokens = 1, 1, 16, 64
        args.epoch_fraction, args.epoch_config = 0.1, "tiny.yaml"
        args.tokenizer_dir = str(tiny_run(args.workdir / "tiny"))
    if args.json is None and not args.smoke:
        args.json = REPO / "bench_results" / "train.json"

    torch.set_num_threads(args.threads)
    if args.tune_malloc:
        tune_malloc()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.profile:
        if args.profile[0] not in SIZES or args.profile[1] not in PRECISIONS:
            arguments.error(f"--profile takes a size ({', '.join(SIZES)}) and a precision ({', '.join(PRECISIONS)})")
        profile_step(args)
        return
    if args.memory_child:
        size, precision, checkpointing = args.memory_child
        memory_child(
            size,
            precision,
            checkpointing == "1",
            args.memory_steps,
            args.length,
            args.target_tokens or SIZES[size]["target_tokens"],
        )
        return

    report = {
        "benchmark": "training speed and memory: ours vs Transformers MarianMTModel / Seq2SeqTrainer",
        "threads": args.threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    if "step" in args.parts:
        report["step"] = bench_step(args)
    if "epoch" in args.parts:
        report["epoch"] = bench_epoch(args)
    if "memory" in args.parts:
        report["memory"] = bench_memory(args)
    if "loss" in args.parts:
        report["loss"] = bench_loss(args)
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
