"""The GPU path's pass/fail checks: training, decoding, resuming and serving on CUDA.

Each check prints one line, `PASS name: what it saw`, `FAIL name: ...` or `SKIP name: why`, and
the JSON holds its figures. A check that raises is a FAIL with the error, and the next one runs.

  training      bf16 and fp16 autocast training of the tiny and base sizes: --steps updates (50),
                every loss finite and the last fifth's mean 0.5 below the first fifth's; in fp16 one update whose
                gradients overflow (the scale raised to 2^60) is skipped by the gradient scaler,
                parameters untouched, and the scale lowered.
  checkpointing one fp32 base-size forward and backward with and without gradient checkpointing:
                the same loss and gradients (1e-5), and the peak of torch.cuda.max_memory_allocated.
  attention     which scaled_dot_product_attention kernel a training step launches (flash,
                memory-efficient, cuDNN or math), in fp32 and bf16; and the explicit path (the
                weights for inspection) gives the fused path's logits: 1e-4 in fp32, and in bf16
                within 2^-5 of the largest logit.
  decoding      tests/test_decode.py, test_beam.py and test_constrained.py's equivalences (cached =
                uncached, beam 1 = greedy, batched beam and constrained search = their reference
                searches) run by pytest with --device; and cached = uncached step logits under bf16
                autocast, within 2^-5 of the largest logit (attn decodes in fp32; this bounds it).
  resume        `attn train` of configs/tiny.yaml in fp32, stopped at update 15 and resumed to 30,
                against 30 updates straight: bitwise the same weights and optimizer state, with
                torch.use_deterministic_algorithms on (and what that costs in seconds); then the
                checkpoint translates the run's test sources on the CPU as it does on the device (a
                sentence may differ only where the CPU scores both outputs within 1e-3: a near tie).
  torchrun      `torchrun --nproc_per_node=1 -m attn_cli train` runs 10 updates and resumes to 20.
  doctor        `attn doctor` names the GPU, and the attention kernels torch has enabled.
  serve         `attn serve --run` answers LibreTranslate's POST /translate with `attn translate`'s
                output for the same sentences.
  compile       the base size's training step with and without torch.compile (train.compile) in
                bf16: first losses alike, and tokens/s of each after a warm-up that has seen each
                of three batch shapes once (a new shape compiles again). Last, being the slowest.

The JSON is written again after each check, so a run stopped at a time limit keeps what it did.

    python3 -m bench.gpu_checks --json $OUT/gpu_checks.json              # on a CUDA machine
    python3 -m bench.gpu_checks --device cpu --json /tmp/gpu_checks.json # the same checks, small, on the CPU
    python3 -m bench.gpu_checks --only training decoding                  # some of them
    python3 -m bench.gpu_checks --smoke --json /tmp/gpu_checks.json       # the CPU, 10 updates: checks that it runs

On the CPU (`--device cpu`, or where torch sees no GPU) every check runs at the tiny size, so the
script is proven before a GPU's minutes are spent; what only a GPU has (its memory, its kernels) is
reported as not measured. `bench/gpu_check.sh` runs this and the GPU benchmarks together.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from bench.toolkit import REPO, attn, attn_serve, parser, post_json, tiny_run, write_report

SIZES = {
    "tiny": {"d_model": 64, "num_heads": 4, "ffn_dim": 256, "layers": 2},
    "base": {"d_model": 512, "num_heads": 8, "ffn_dim": 2048, "layers": 6},
}
VOCAB = 8000
TOKENS_USED = 500  # the random batches draw ids 4..499, so a model learns their distribution within 50 updates
BF16_BOUND = 2.0**-5  # bf16 keeps 8 bits of mantissa; a few roundings per layer stay well inside 2^-5 of the scale


@dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    figures: dict = field(default_factory=dict)


@dataclass
class Context:
    device: torch.device
    sizes: list[str]  # the model sizes the training checks take
    workdir: Path
    steps: int  # updates of each training check
    batches: int  # distinct random batches the training checks cycle through

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


# --- models and batches


def build(size: str, dropout: float = 0.1):
    from attn_cli.model import Transformer

    dims = SIZES[size]
    return Transformer(
        VOCAB, VOCAB, dims["d_model"], dims["num_heads"], dims["ffn_dim"], dims["layers"], dims["layers"], dropout
    )


def random_batches(count: int, max_tokens: int, seed: int = 0) -> list:
    """`count` length-bucketed batches of random sentences (5 to 40 tokens) from attn's batcher."""
    import random

    from attn_cli.data.batching import Example, token_batches
    from attn_cli.data.collate import collate

    rng = random.Random(seed)
    examples = [
        Example(
            index,
            [rng.randrange(4, TOKENS_USED) for _ in range(rng.randint(5, 40))],
            [rng.randrange(4, TOKENS_USED) for _ in range(rng.randint(5, 40))],
        )
        for index in range(max_tokens * count // 40)
    ]
    batches = [
        collate([examples[p] for p in positions])
        for positions in token_batches(examples, max_tokens, shuffle=True, seed=1)
    ]
    return batches[:count]


def training_step(model, precision_name: str, device: torch.device, compiled: bool = False):
    from attn_cli.training.precision import Precision
    from attn_cli.training.setup import inverse_sqrt_schedule
    from attn_cli.training.step import TrainingObjective, TrainingStep, adamw

    precision = Precision(precision_name, "")
    optimizer = adamw(model.parameters(), 1e-3, (0.9, 0.98), 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(10))
    objective = TrainingObjective(model, 0.1)
    if compiled:
        objective = torch.compile(objective)
    return TrainingStep(model, objective, optimizer, scheduler, precision.grad_scaler(device), precision, device, 1.0)


def parameters_copy(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# --- the checks


def check_training(context: Context) -> Outcome:
    figures, problems = {}, []
    for size in context.sizes:
        batches = [b.to(context.device) for b in random_batches(context.batches, 4096 if size == "base" else 1024)]
        for precision in ("bf16", "fp16"):
            torch.manual_seed(0)
            model = build(size).to(context.device)
            update = training_step(model, precision, context.device)
            losses = [update([batches[step % len(batches)]]).loss for step in range(context.steps)]
            fifth = max(1, context.steps // 5)
            first, last = statistics.mean(losses[:fifth]), statistics.mean(losses[-fifth:])
            row = {"first_fifth": round(first, 3), "last_fifth": round(last, 3)}
            if not all(map(math.isfinite, losses)):
                problems.append(f"{size} {precision}: a loss was not finite")
            elif not last < first - 0.5:
                problems.append(f"{size} {precision}: loss {first:.2f} -> {last:.2f} did not fall")
            if precision == "fp16":
                update.scaler.update(2.0**60)  # the next backward overflows in fp16
                before, scale = parameters_copy(model), update.scaler.get_scale()
                counted = update([batches[0]]).applied
                untouched = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
                row |= {"overflow_step_skipped": untouched, "scale_after_overflow": update.scaler.get_scale()}
                if counted or not untouched or not update.scaler.get_scale() < scale:
                    problems.append(f"{size} fp16: the overflowing update was not skipped by the scaler")
            figures[f"{size} {precision}"] = row
            del model, update
    summary = ", ".join(f"{name} {row['first_fifth']}->{row['last_fifth']}" for name, row in figures.items())
    return Outcome("training", "FAIL" if problems else "PASS", "; ".join(problems) or f"loss {summary}", figures)


def forward_backward(model, batch) -> tuple[float, list[torch.Tensor]]:
    from attn_cli.training.step import TrainingObjective

    torch.manual_seed(1)  # the same dropout masks for both
    loss = TrainingObjective(model, 0.1)(batch.src, batch.tgt_in, batch.tgt_out) / batch.num_target_tokens
    loss.backward()
    gradients = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.item(), gradients


def check_checkpointing(context: Context) -> Outcome:
    size = context.sizes[-1]
    batch = random_batches(1, 4096 if size == "base" else 1024)[0].to(context.device)
    torch.manual_seed(0)
    model = build(size).to(context.device).train()
    figures = {"size": size}
    results = {}
    for checkpointing in (False, True):
        model.gradient_checkpointing = checkpointing
        if context.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            baseline = torch.cuda.memory_allocated()
        results[checkpointing] = forward_backward(model, batch)
        if context.cuda:
            torch.cuda.synchronize()
            figures[f"peak_mib_{'with' if checkpointing else 'without'}"] = round(
                (torch.cuda.max_memory_allocated() - baseline) / 2**20, 1
            )
    (loss_plain, grads_plain), (loss_ckpt, grads_ckpt) = results[False], results[True]
    gradient_gap = max((a - b).abs().max().item() for a, b in zip(grads_plain, grads_ckpt))
    figures |= {"loss_without": loss_plain, "loss_with": loss_ckpt, "max_gradient_difference": gradient_gap}
    same = abs(loss_plain - loss_ckpt) <= 1e-5 and gradient_gap <= 1e-5
    memory = (
        f"peak {figures['peak_mib_without']:,.0f} MiB -> {figures['peak_mib_with']:,.0f} MiB"
        if context.cuda
        else "memory not measured on the CPU"
    )
    lower = not context.cuda or figures["peak_mib_with"] < figures["peak_mib_without"]
    detail = f"{size} fp32: loss {loss_plain:.6f} / {loss_ckpt:.6f}, gradients within {gradient_gap:.1e}; {memory}"
    return Outcome("checkpointing", "PASS" if same and lower else "FAIL", detail, figures)


SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_attention_math": "math",
}


def kernels_of_a_step(update, batch) -> list[str]:
    """The fused attention ops one training step launched (their names on the CPU side of the profile)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        update([batch])
    names = {event.key for event in profiler.key_averages()}
    found = sorted({SDPA_OPS.get(name, name) for name in names if name.startswith("aten::_scaled_dot_product")})
    found = [name for name in found if not name.endswith("_backward")]
    return found or (["explicit (matmul and softmax)"] if "aten::softmax" in names else ["none found"])


def check_attention(context: Context) -> Outcome:
    from attn_cli.training.precision import Precision

    size = context.sizes[-1]
    batch = random_batches(1, 2048)[0].to(context.device)
    figures, problems = {}, []
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build(size).to(context.device)
        figures[f"training_kernels_{precision}"] = kernels_of_a_step(
            training_step(model, precision, context.device), batch
        )
        model.eval()
        with torch.no_grad(), Precision(precision, "").autocast(context.device):
            fused = model.decode(batch.tgt_in, model.encode(batch.src)).float()
            weights: dict = {}
            explicit = model.decode(batch.tgt_in, model.encode(batch.src, attention=weights), attention={}).float()
        real = batch.tgt_in != 0
        gap = (fused - explicit).abs()[real].max().item()
        bound = 1e-4 if precision == "fp32" else BF16_BOUND * fused[real].abs().max().item()
        figures[f"explicit_vs_fused_{precision}"] = {"max_difference": gap, "bound": bound}
        if not gap <= bound:
            problems.append(f"{precision}: the explicit path is {gap:.2e} from the fused one (bound {bound:.2e})")
    detail = (
        f"{size}: training kernels fp32 {'+'.join(figures['training_kernels_fp32'])}, "
        f"bf16 {'+'.join(figures['training_kernels_bf16'])}; explicit = fused within "
        f"{figures['explicit_vs_fused_fp32']['max_difference']:.1e} (fp32), "
        f"{figures['explicit_vs_fused_bf16']['max_difference']:.1e} (bf16)"
    )
    return Outcome("attention", "FAIL" if problems else "PASS", "; ".join(problems) or detail, figures)


def check_decoding(context: Context) -> Outcome:
    from attn_cli.vocab import BOS_ID

    tests = ["tests/test_decode.py", "tests/test_beam.py", "tests/test_constrained.py"]
    chosen = "cached or reference or greedy_decoding"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", context.device.type]
    result = subprocess.run([*command, *tests, "-k", chosen], capture_output=True, text=True, cwd=REPO)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-300:]
    figures = {"pytest": tail, "pytest_exit_status": result.returncode}

    size = context.sizes[-1]
    torch.manual_seed(0)
    model = build(size, dropout=0.0).to(context.device).eval()
    src = random_batches(1, 512)[0].src.to(context.device)
    prefix = torch.full((src.shape[0], 1), BOS_ID, device=context.device)
    gap, scale = 0.0, 0.0
    with torch.no_grad(), torch.autocast(context.device.type, dtype=torch.bfloat16):
        encoded, cache = model.encode(src), model.new_cache()
        for _ in range(10):
            cached = model.decode(prefix[:, -1:], encoded, cache)[:, -1].float()
            full = model.decode(prefix, encoded)[:, -1].float()
            gap, scale = max(gap, (cached - full).abs().max().item()), max(scale, full.abs().max().item())
            prefix = torch.cat([prefix, full.argmax(-1, keepdim=True)], dim=1)
    figures["bf16_cached_vs_uncached"] = {"max_difference": gap, "bound": BF16_BOUND * scale}
    passed = result.returncode == 0 and gap <= BF16_BOUND * scale
    bound = BF16_BOUND * scale
    detail = f"pytest --device {context.device.type}: {tail}; bf16 cached vs uncached {gap:.2e} (bound {bound:.2e})"
    if result.returncode != 0:
        figures["pytest_output"] = result.stdout[-4000:]
    return Outcome("decoding", "PASS" if passed else "FAIL", detail, figures)


def train_in_process(run_dir: Path, device: str, *settings: str, resume: bool = False) -> float:
    """`attn train` of configs/tiny.yaml in this process (where deterministic algorithms are set), in seconds."""
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    arguments = ["train", "--config", "configs/tiny.yaml", "--set", f"run_dir={run_dir}"]
    for setting in (f"train.device={device}", "train.precision=fp32", "train.valid_bleu=false", *settings):
        arguments += ["--set", setting]
    started = time.perf_counter()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        result = CliRunner().invoke(app, arguments + (["--resume"] if resume else []))
    finally:
        os.chdir(cwd)
    if result.exit_code != 0:
        raise RuntimeError(f"attn train failed ({result.exit_code}): {result.output[-2000:]}")
    return time.perf_counter() - started


def last_checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)


def same_tensors(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        return torch.equal(left.cpu(), right.cpu())
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same_tensors(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(same_tensors(a, b) for a, b in zip(left, right))
    return left == right


def near_tie(translation: str, on_cpu: dict) -> bool:
    """Whether the CPU's own search scores the device's `translation` within 1e-3 of its best: two
    hypotheses that close in score may swap places between devices through rounding alone, which
    says nothing about the checkpoint."""
    scores = {hypothesis["translation"]: hypothesis["score"] for hypothesis in on_cpu["n_best"]}
    return translation in scores and abs(scores[translation] - on_cpu["score"]) < 1e-3


def check_resume(context: Context) -> Outcome:
    device = context.device.type
    settings = ("model.dropout=0.1", "train.accumulate=2", "train.valid_every=10", "train.join.rate=0.3")
    figures = {}
    free = context.workdir / "resume-nondeterministic"
    figures["seconds_straight_nondeterministic"] = round(
        train_in_process(free, device, "train.max_steps=30", *settings), 1
    )
    torch.use_deterministic_algorithms(True)
    try:
        straight, resumed = context.workdir / "resume-straight", context.workdir / "resume-resumed"
        figures["seconds_straight_deterministic"] = round(
            train_in_process(straight, device, "train.max_steps=30", *settings), 1
        )
        train_in_process(resumed, device, "train.max_steps=15", *settings)
        train_in_process(resumed, device, "train.max_steps=30", *settings, resume=True)
    finally:
        torch.use_deterministic_algorithms(False)
    expected, actual = last_checkpoint(straight), last_checkpoint(resumed)
    bitwise = (
        actual["step"] == expected["step"] == 30
        and same_tensors(actual["model"], expected["model"])
        and same_tensors(actual["training_state"]["optimizer"], expected["training_state"]["optimizer"])
    )
    figures["bitwise"] = bitwise
    figures["nondeterministic_equals_deterministic"] = same_tensors(last_checkpoint(free)["model"], expected["model"])

    sources = (straight / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:50]
    source_file = context.workdir / "resume-sources.en"
    source_file.write_text("\n".join(sources) + "\n", encoding="utf-8")
    outputs = {}
    for where in sorted({device, "cpu"}):
        translated = attn(
            "translate", "--run", str(straight), "--device", where, "--input", str(source_file),
            "--format", "jsonl", "--n-best", "2",
        )  # fmt: skip
        outputs[where] = [json.loads(line) for line in translated.splitlines()]
    differing, near_ties = 0, 0
    for on_device, on_cpu in zip(outputs[device], outputs["cpu"]):
        if on_device["translation"] != on_cpu["translation"]:
            differing += 1
            near_ties += near_tie(on_device["translation"], on_cpu)
    figures |= {"translated": len(sources), "differing_on_the_cpu": differing, "near_ties": near_ties}
    passed = bitwise and differing == near_ties and len(outputs["cpu"]) == len(sources)
    cost = figures["seconds_straight_deterministic"] / figures["seconds_straight_nondeterministic"]
    detail = (
        f"{device} fp32 15+15 updates {'bitwise' if bitwise else 'NOT bitwise'} the 30 straight; deterministic "
        f"algorithms {cost:.2f}x the time; {len(sources) - differing}/{len(sources)} translations the same on the "
        f"CPU, {near_ties} of the {differing} others near ties"
    )
    return Outcome("resume", "PASS" if passed else "FAIL", detail, figures)


def check_compile(context: Context) -> Outcome:
    size = context.sizes[-1]
    # Three shapes: each new one compiles again (the second marks lengths dynamic), minutes at base size.
    batches = [b.to(context.device) for b in random_batches(min(3, context.batches), 4096 if size == "base" else 1024)]
    precision = "bf16" if context.cuda else "fp32"
    figures, first_losses = {"size": size, "precision": precision}, {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = build(size, dropout=0.0).to(context.device)
        update = training_step(model, precision, context.device, compiled=compiled)
        started = time.perf_counter()
        first_losses[compiled] = update([batches[0]]).loss
        for batch in batches[1:]:  # every batch shape once: compiling for a new shape is warm-up too
            update([batch])
        context.synchronize()
        warmup = time.perf_counter() - started
        tokens, started = 0, time.perf_counter()
        for step in range(20):
            batch = batches[step % len(batches)]
            update([batch])
            tokens += batch.num_source_tokens + batch.num_target_tokens
        context.synchronize()
        name = "compiled" if compiled else "eager"
        figures[name] = {
            "tokens_per_second": round(tokens / (time.perf_counter() - started)),
            "warmup_s": round(warmup, 1),
        }
        del model, update
    ratio = figures["compiled"]["tokens_per_second"] / figures["eager"]["tokens_per_second"]
    figures["compiled_over_eager"] = round(ratio, 3)
    alike = abs(first_losses[True] - first_losses[False]) <= 1e-2 * abs(first_losses[False])
    detail = (
        f"{size} {precision}: eager {figures['eager']['tokens_per_second']:,} tok/s, compiled "
        f"{figures['compiled']['tokens_per_second']:,} tok/s ({ratio:.2f}x, {figures['compiled']['warmup_s']} s "
        f"to compile and warm up); first loss {first_losses[False]:.4f} / {first_losses[True]:.4f}"
    )
    return Outcome("compile", "PASS" if alike else "FAIL", detail, figures)


def check_torchrun(context: Context) -> Outcome:
    run_dir = context.workdir / "torchrun"
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "attn_cli"]
    base += ["train", "--config", "configs/tiny.yaml", "--set", f"run_dir={run_dir}", "--set"]
    base += [f"train.device={context.device.type}", "--set", "train.valid_every=10", "--set", "train.valid_bleu=false"]
    for steps, resume in ((10, []), (20, ["--resume"])):
        result = subprocess.run(
            [*base, "--set", f"train.max_steps={steps}", *resume], capture_output=True, text=True, cwd=REPO
        )
        if result.returncode != 0:
            return Outcome("torchrun", "FAIL", f"{steps} updates: exit {result.returncode}: {result.stderr[-600:]}")
    step = last_checkpoint(run_dir)["step"]
    detail = f"torchrun --nproc_per_node=1: 10 updates, resumed to {step} (one process runs without a process group)"
    return Outcome("torchrun", "PASS" if step == 20 else "FAIL", detail, {"last_step": step})


def check_doctor(context: Context) -> Outcome:
    import json

    # Its report whatever its exit status: a failed check exits non-zero with the JSON on stdout.
    doctor = ["doctor", "--config", "configs/tiny.yaml", "--set", f"train.device={context.device.type}", "--json"]
    result = subprocess.run([sys.executable, "-m", "attn_cli", *doctor], capture_output=True, text=True, cwd=REPO)
    if not result.stdout.strip().startswith("{"):
        return Outcome("doctor", "FAIL", f"exit {result.returncode}: {result.stderr[-600:]}")
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    found = {name: checks[name]["found"] for name in ("device", "attention kernels", "training step") if name in checks}
    wanted = {"device": torch.cuda.get_device_name(0) if context.cuda else "cpu"}
    missing = [
        f"{name} naming {word!r}" for name, word in wanted.items() if word.lower() not in found.get(name, "").lower()
    ]
    if context.cuda:  # the kernels it reports are those torch says are enabled
        reported = checks.get("attention kernels", {}).get("numbers", {})
        enabled = {
            "memory-efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cuDNN": torch.backends.cuda.cudnn_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
        missing += [f"attention kernel {name}={on}" for name, on in enabled.items() if reported.get(name) != on]
    failed = [name for name, check in checks.items() if check["status"] == "fail"]
    detail = " | ".join(f"{name}: {text}" for name, text in found.items())
    if missing or failed:
        detail = f"lacks {missing}, failed {failed}: {detail}"
    return Outcome("doctor", "FAIL" if missing or failed else "PASS", detail, {"checks": list(checks.values())})


def check_serve(context: Context) -> Outcome:
    run_dir = tiny_run(context.workdir / "tiny")
    sentences = (run_dir / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:8]
    device = context.device.type
    source_file = context.workdir / "serve-sources.en"
    source_file.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    expected = attn("translate", "--run", str(run_dir), "--device", device, "--input", str(source_file))
    with attn_serve("serve", ["--run", str(run_dir)], context.workdir, device=device) as server:
        status, answer = post_json(server.port, "/translate", {"q": sentences, "source": "en", "target": "zh"})
    served = answer.get("translatedText") if isinstance(answer, dict) else None
    same = status == 200 and served == expected.splitlines()
    detail = f"POST /translate on {device}: {status}, {len(sentences)} sentences, " + (
        "the same as attn translate" if same else f"differs from attn translate: {answer!r:.300}"
    )
    return Outcome("serve", "PASS" if same else "FAIL", detail, {"status": status, "started_in_s": server.started_in})


CHECKS: dict[str, Callable[[Context], Outcome]] = {
    "training": check_training,
    "checkpointing": check_checkpointing,
    "attention": check_attention,
    "decoding": check_decoding,
    "resume": check_resume,
    "torchrun": check_torchrun,
    "doctor": check_doctor,
    "serve": check_serve,
    "compile": check_compile,  # last: the slowest, so a time limit cuts it rather than the others
}


def run_checks(context: Context, names: list[str], report: Callable[[list[Outcome]], None]) -> list[Outcome]:
    """The checks `names` in turn; `report` gets the outcomes so far after each (a run stopped at a
    time limit keeps what it finished)."""
    outcomes = []
    for name in names:
        started = time.perf_counter()
        try:
            outcome = CHECKS[name](context)
        except Exception as error:  # one check's crash is its FAIL; the others still run
            outcome = Outcome(name, "FAIL", f"{type(error).__name__}: {error}", {"traceback": traceback.format_exc()})
        outcome.figures["seconds"] = round(time.perf_counter() - started, 1)
        print(f"{outcome.status} {outcome.name}: {outcome.detail} ({outcome.figures['seconds']} s)", flush=True)
        outcomes.append(outcome)
        report(outcomes)
        if context.cuda:
            torch.cuda.empty_cache()
    return outcomes


def main() -> None:
    arguments = parser(__doc__, "the checks on the CPU at the tiny size, 10 updates each")
    arguments.add_argument("--device", choices=["cuda", "cpu"], help="cuda where torch sees a GPU, else cpu")
    arguments.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    arguments.add_argument("--steps", type=int, default=50, help="updates of each training check (50)")
    arguments.add_argument("--workdir", type=Path, help="where the checks' runs go (a temporary folder by default)")
    args = arguments.parse_args()
    # The resume check's deterministic cuBLAS needs this before CUDA starts (and costs nothing else).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.smoke:
        args.device, args.steps = "cpu", 10
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_checks: --device cuda, but torch {torch.__version__} sees no CUDA device")
    with tempfile.TemporaryDirectory(prefix="attn-gpu-checks-") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        sizes = ["tiny", "base"] if device.type == "cuda" else ["tiny"]
        context = Context(device, sizes, workdir, args.steps, batches=2 if args.smoke else 8)
        where = torch.cuda.get_device_name(0) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
        print(f"gpu_checks on {where}, torch {torch.__version__}, sizes {', '.join(context.sizes)}", flush=True)
        header = {"device": where, "torch": torch.__version__, "sizes": context.sizes}

        def report(outcomes: list[Outcome]) -> None:
            write_report(args.json, header | {"checks": [o.__dict__ for o in outcomes]}, args)

        outcomes = run_checks(context, args.only, report)
    failed = [o.name for o in outcomes if o.status == "FAIL"]
    passed = f"{len(outcomes) - len(failed)} of {len(outcomes)} checks passed"
    print(passed + (f"; failed: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
