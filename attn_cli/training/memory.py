"""A training step's memory: estimated from the config before any tensor exists, recognised when
it runs out, and told as one line that says what to change.

The estimate is shared by `attn doctor` (its memory check) and a training run that ran out of
memory, so that both give the same advice. It counts the tensors a step keeps: the weights, their
gradients and AdamW's two moments (fp32), the low-precision copies of the weights autocast makes,
the activations each layer keeps for backward, the attention weights of every layer, (rows, heads,
length, length) each, and the workspace of the loss. It leaves out the allocator's slack and the
libraries' own workspaces: it is an estimate, for the worst batch the config allows
(docs/doctor.md has the formula).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_cli.config import Config, TrainConfig
from attn_cli.data.collate import Batch
from attn_cli.errors import UserError
from attn_cli.model import build_model
from attn_cli.paths import RunPaths
from attn_cli.training.loss import CHUNK_ELEMENTS, GPU_CHUNK_ELEMENTS

FP32_BYTES = 4
HALF_BYTES = 2  # bf16 and fp16

# Values a layer keeps for backward, per token, in units of d_model (besides the FFN's hidden layer:
# ffn_dim values per token for ReLU, whose output is all its backward and the next Linear's need;
# twice that for GELU and SiLU, whose backward needs their input as well). Encoder layer, pre- or
# post-LN: the attention's LayerNorm input and output, q, k and v, the attention output before
# out_proj, the FFN's LayerNorm input and output: 8.
ENCODER_VALUES_PER_TOKEN = 8
# Decoder layer: self-attention as above (6), cross-attention's LayerNorm input and output, its
# queries and its output (4), the FFN's LayerNorm input and output (2): 12 per target token; and the
# cross-attention keys and values, 2 per source token.
DECODER_VALUES_PER_TARGET_TOKEN = 12
DECODER_VALUES_PER_SOURCE_TOKEN = 2
# Each side's embedding output and final LayerNorm input and output.
STACK_END_VALUES_PER_TOKEN = 3
# AdamW keeps two moments per parameter; training also keeps a gradient per parameter.
ADAMW_MOMENTS = 2


@dataclass(frozen=True)
class WorstBatch:
    """The batch that costs the most memory: the longest pairs the length filters keep, as many
    rows as train.max_tokens holds of them (attention grows with the square of the length, so for
    a fixed token budget the longest rows cost the most)."""

    rows: int
    source_length: int  # tokens, EOS included
    target_length: int  # tokens, BOS included

    def describe(self) -> str:
        return f"{self.rows:,} rows x {self.source_length:,} source / {self.target_length:,} target tokens"


def worst_batch(cfg: Config) -> WorstBatch:
    source, target = (longest + 1 for longest in cfg.longest_training_sides())
    return WorstBatch(max(1, cfg.train.max_tokens // max(source, target)), source, target)


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one training step, by what holds them."""

    batch: WorstBatch
    precision: str  # fp32, bf16 or fp16: what the activations are kept in
    parameters: int  # a count, not bytes
    weights: int
    gradients: int
    optimizer: int
    autocast_weights: int
    activations: int
    attention: int
    loss: int
    backward: int  # the gradients of one layer's activations, alive while backward passes through it

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.autocast_weights
            + self.activations
            + self.attention
            + self.loss
            + self.backward
        )

    def parts(self) -> dict[str, int]:
        """The bytes of each part, for a report."""
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "AdamW moments": self.optimizer,
            "autocast weight copies": self.autocast_weights,
            "activations": self.activations,
            "attention weights": self.attention,
            "loss": self.loss,
            "backward": self.backward,
        }


def count_parameters(cfg: Config, src_vocab_size: int, tgt_vocab_size: int) -> int:
    with torch.device("meta"):  # shapes only: nothing is allocated
        return sum(p.numel() for p in build_model(cfg.model, src_vocab_size, tgt_vocab_size).parameters())


def estimate_step_memory(
    cfg: Config, src_vocab_size: int, tgt_vocab_size: int, precision: str, device_type: str
) -> StepMemory:
    """The bytes one training step needs for the worst batch of `cfg` at `precision` (fp32, bf16 or
    fp16: what train.precision resolves to) on a device of `device_type` ("cpu" or "cuda")."""
    model, train = cfg.model, cfg.train
    parameters = count_parameters(cfg, src_vocab_size, tgt_vocab_size)
    value = HALF_BYTES if precision in ("bf16", "fp16") else FP32_BYTES
    batch = worst_batch(cfg)
    rows, source, target = batch.rows, batch.source_length, batch.target_length
    width, hidden = model.d_model, model.ffn_dim * (1 if model.activation == "relu" else 2)

    # Per layer: what the explicit attention keeps (the softmax output, and the dropout's output
    # when attention_dropout is on), and the other activations.
    copies = 2 if model.attention_dropout > 0 else 1
    encoder_scores = value * copies * rows * model.num_heads * source * source
    decoder_scores = value * copies * rows * model.num_heads * (target * target + target * source)
    encoder_layer = value * rows * source * (ENCODER_VALUES_PER_TOKEN * width + hidden)
    decoder_layer = (
        value
        * rows
        * (
            target * (DECODER_VALUES_PER_TARGET_TOKEN * width + hidden)
            + source * DECODER_VALUES_PER_SOURCE_TOKEN * width
        )
    )
    stack_ends = value * rows * (source + target) * STACK_END_VALUES_PER_TOKEN * width
    largest_layer = max(encoder_layer + encoder_scores, decoder_layer + decoder_scores)
    if train.gradient_checkpointing:
        # Only each layer's input is kept; backward recomputes one layer at a time.
        activations = (
            value * rows * width * (model.encoder_layers * source + model.decoder_layers * target)
            + stack_ends
            + largest_layer
        )
        attention = 0  # counted in the recomputed layer
    else:
        activations = model.encoder_layers * encoder_layer + model.decoder_layers * decoder_layer + stack_ends
        attention = model.encoder_layers * encoder_scores + model.decoder_layers * decoder_scores
    # The loss keeps the gradients of the output matrix and of the decoder output (fp32), and works
    # on one (rows, vocabulary) chunk of logits at a time: the logits, their exponentials, their gradient.
    chunk = CHUNK_ELEMENTS if device_type == "cpu" else GPU_CHUNK_ELEMENTS
    loss = FP32_BYTES * (
        tgt_vocab_size * width + rows * target * width + 3 * min(chunk, rows * target * tgt_vocab_size)
    )
    half = value == HALF_BYTES
    return StepMemory(
        batch=batch,
        precision=precision,
        parameters=parameters,
        weights=FP32_BYTES * parameters,
        gradients=FP32_BYTES * parameters,
        optimizer=ADAMW_MOMENTS * FP32_BYTES * parameters,
        autocast_weights=HALF_BYTES * parameters if half else 0,
        activations=activations,
        attention=attention,
        loss=loss,
        backward=largest_layer,
    )


def memory_advice(train: TrainConfig) -> str:
    """What lowers a step's memory, most effective first, leaving out what the config already does:
    the tutorial's gradient checkpointing, smaller batches and bf16."""
    steps = []
    if not train.gradient_checkpointing:
        steps.append("set train.gradient_checkpointing: true")
    steps.append(
        f"lower train.max_tokens (now {train.max_tokens:,}; raise train.accumulate to keep the effective batch)"
    )
    if train.precision not in ("bf16", "fp16"):
        steps.append("set train.precision: bf16")
    return ", ".join(steps[:-1]) + f" or {steps[-1]}" if len(steps) > 1 else steps[0]


def gigabytes(count: int) -> str:
    return f"{count / 2**30:,.2f} GB"


# How allocators say it: CUDA's torch.OutOfMemoryError, and the CPU allocator's RuntimeError
# ("DefaultCPUAllocator: can't allocate memory: ...", "... not enough memory: ...").
_OUT_OF_MEMORY_WORDS = ("out of memory", "can't allocate memory", "not enough memory")


class TrainingOutOfMemory(UserError, MemoryError):
    """A training step needed more memory than the device has; the message says which batch and what to change."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a failed allocation, rather than a bug that must keep its traceback."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    first_line = str(error).strip().splitlines()[0].lower() if str(error).strip() else ""
    return isinstance(error, RuntimeError) and any(words in first_line for words in _OUT_OF_MEMORY_WORDS)


def describe_batches(batches: Sequence[Batch]) -> str:
    """The batch (or, for an update of several, the largest) as rows x longest source / target tokens."""

    def size(batch: Batch) -> str:
        rows, source = batch.src.shape
        return f"{rows:,} rows x {source:,} source / {batch.tgt_in.shape[1]:,} target tokens"

    if len(batches) == 1:
        return f"the batch of {size(batches[0])}"
    largest = max(batches, key=lambda batch: batch.src.numel() + batch.tgt_in.numel())
    return f"one of the update's {len(batches)} batches (the largest: {size(largest)})"


def out_of_memory_message(
    what_failed: str, device: torch.device, train: TrainConfig, paths: RunPaths, saved_step: int | None
) -> str:
    """The line a run that ran out of memory ends with; `saved_step` is the step last.pt was saved
    at, None when it could not be saved."""
    saved = (
        f"last.pt holds the state before it (step {saved_step:,}): {paths.last_checkpoint}"
        if saved_step is not None
        else "no checkpoint was saved"
    )
    # Gradient checkpointing and precision may change on --resume; the batch size may not (it shapes the data order).
    resumable = [
        setting
        for setting, done in (
            ("train.gradient_checkpointing=true", train.gradient_checkpointing),
            ("train.precision=bf16", train.precision in ("bf16", "fp16")),
        )
        if not done
    ]
    resume = (
        f"; continue with `attn train --config {paths.config} --resume --set {resumable[0]}`"
        if resumable and saved_step is not None
        else ""
    )
    return (
        f"out of memory on {device}: {what_failed} did not fit; {saved}; "
        f"{memory_advice(train)}{resume} (a smaller train.max_tokens needs a new run_dir); "
        f"`attn doctor --config {paths.config}` estimates a step's memory"
    )
