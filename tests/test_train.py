"""Training learns, and checkpoints rebuild exactly what was saved."""

from pathlib import Path

import pytest
import torch
from support.models import reversal_batch, small_model
from support.runs import checkpoint_parts, train_tiny

from attn_cli.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from attn_cli.decoding.greedy import greedy_decode
from attn_cli.training.loss import label_smoothed_loss
from attn_cli.training.setup import inverse_sqrt_schedule
from attn_cli.vocab import PAD_ID


@pytest.mark.slow  # trains a model for seconds
def test_tiny_model_learns_to_reverse_sequences(one_thread):
    torch.manual_seed(0)
    model = small_model(src_vocab_size=14, tgt_vocab_size=14, d_model=64, ffn_dim=128).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(50))
    generator = torch.Generator().manual_seed(0)
    for _ in range(400):  # the loss is near 0.006 by then, 200 of 200 reversed
        batch = reversal_batch(generator, batch=64, lengths=(2, 6), vocab=14)
        loss_sum, tokens = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0.0)
        optimizer.zero_grad()
        (loss_sum / tokens).backward()
        optimizer.step()
        schedule.step()
    model.eval()
    batch = reversal_batch(torch.Generator().manual_seed(1), batch=200, lengths=(2, 6), vocab=14)
    with torch.no_grad():
        loss_sum, tokens = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0.0)
    assert loss_sum.item() / tokens < 0.02
    decoded = greedy_decode(model, batch.src)
    expected = [row[row != PAD_ID].tolist()[:-1] for row in batch.tgt_out]
    assert sum(d == e for d, e in zip(decoded, expected)) >= 196


def test_label_smoothed_loss_ignores_padding():
    logits = torch.randn(2, 4, 10)
    labels = torch.tensor([[5, 6, 3, 0], [7, 3, 0, 0]])
    loss_sum, tokens = label_smoothed_loss(logits, labels, 0.1)
    changed = logits.clone()
    changed[labels == PAD_ID] = 100.0
    assert tokens == 5
    torch.testing.assert_close(label_smoothed_loss(changed, labels, 0.1)[0], loss_sum)


def test_inverse_sqrt_schedule_warms_up_then_decays():
    factor = inverse_sqrt_schedule(100)
    assert factor(1) == 0.01 and factor(50) == 0.5 and factor(100) == 1.0
    assert abs(factor(400) - 0.5) < 1e-12


def test_checkpoint_round_trip_gives_identical_logits(tmp_path):
    cfg, tokenizers, model = checkpoint_parts()
    vocab = tokenizers.source.vocab_size
    path = tmp_path / "checkpoints" / "best.pt"
    save_checkpoint(path, cfg, tokenizers, model, step=7, epoch=2, metrics={"valid_bleu": 1.5})
    loaded = load_checkpoint(path)
    src = torch.randint(4, vocab, (3, 6))
    tgt = torch.randint(4, vocab, (3, 5))
    assert torch.equal(model(src, tgt), loaded.model(src, tgt))
    assert (loaded.step, loaded.epoch, loaded.metrics) == (7, 2, {"valid_bleu": 1.5})
    assert loaded.config == cfg
    assert loaded.tokenizers.target.encode(["句子5号"]) == tokenizers.target.encode(["句子5号"])
    assert not list(path.parent.glob("*.tmp")), "the temporary file must be renamed away"


class _Planted:
    """An object whose unpickling touches a file: what a malicious checkpoint would run instead."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("where", ["the whole file", "inside a valid checkpoint"])
def test_loading_a_checkpoint_never_runs_code_hidden_in_it(tmp_path, where):
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    marker = tmp_path / "ran"
    path = tmp_path / "planted.pt"
    if where == "the whole file":
        torch.save(_Planted(marker), path)
    else:
        cfg, tokenizers, model = checkpoint_parts()
        save_checkpoint(path, cfg, tokenizers, model, step=1, epoch=1)
        payload = torch.load(path, weights_only=True)
        payload["metrics"] = {"valid_bleu": _Planted(marker)}
        torch.save(payload, path)
    with pytest.raises(CheckpointError, match="holds objects other than tensors and plain data"):
        load_checkpoint(path)
    # The same file where each command that loads a checkpoint finds it.
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("best.pt", "last.pt", "step-1.pt", "step-2.pt"):
        (run / "checkpoints" / name).write_bytes(path.read_bytes())
    (run / "config.yaml").write_text(
        f"run_dir: {run}\ndata:\n  corpus:\n    path: corpus.tsv\n  src_lang: en\n  tgt_lang: zh\n"
    )
    commands = [
        ["translate", "--checkpoint", str(path), "Hello."],
        ["translate", "--run", str(run), "Hello."],
        ["eval", "--checkpoint", str(path)],
        ["eval", "--run", str(run)],
        ["average", "--run", str(run), "--last", "2"],
        ["train", "--config", str(run / "config.yaml"), "--resume"],
    ]
    for command in commands:
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and "nothing in the file was run" in result.output, (command, result.output)
        assert "Traceback" not in result.output
    assert not marker.exists(), "the planted code ran"


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    from attn_cli import checkpoint as checkpoint_module

    cfg, tokenizers, model = checkpoint_parts()
    path = tmp_path / "last.pt"
    save_checkpoint(path, cfg, tokenizers, model, step=1, epoch=1)

    def killed_midway(payload, handle):
        handle.write(b"half a checkpoint")
        raise KeyboardInterrupt  # what a signal during the write raises

    monkeypatch.setattr(checkpoint_module.torch, "save", killed_midway)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    try:
        save_checkpoint(path, cfg, tokenizers, model, step=2, epoch=1)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the failed save must not pass silently")
    monkeypatch.undo()
    assert load_checkpoint(path).step == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"], "the temporary file must be removed"


def _chained(error: Exception, cause: Exception) -> Exception:
    error.__context__ = cause
    return error


@pytest.mark.parametrize(
    "failure",
    [
        OSError(28, "No space left on device"),
        RuntimeError(
            "[enforce fail at inline_container.cc] PytorchStreamWriter failed writing file data/0: file write failed"
        ),
        _chained(
            RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 255936 vs 255828"),
            OSError(28, "No space left on device"),
        ),
    ],
)
def test_a_full_disk_is_one_line_that_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failure):
    from attn_cli import checkpoint as checkpoint_module
    from attn_cli.files import WriteError

    cfg, tokenizers, model = checkpoint_parts()
    path = tmp_path / "last.pt"
    save_checkpoint(path, cfg, tokenizers, model, step=1, epoch=1)

    def disk_full(payload, handle):
        handle.write(b"part of a checkpoint")
        raise failure

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_full)
    with pytest.raises(WriteError) as error:
        save_checkpoint(path, cfg, tokenizers, model, step=2, epoch=1)
    monkeypatch.undo()
    assert str(error.value).startswith(f"cannot write {path}: ") and str(error.value).endswith(
        "the previous last.pt is intact"
    )
    assert "\n" not in str(error.value)
    assert load_checkpoint(path).step == 1 and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_checkpoint_with_a_missing_part_is_refused_in_one_line(tmp_path):
    cfg, tokenizers, model = checkpoint_parts()
    path = tmp_path / "best.pt"
    save_checkpoint(path, cfg, tokenizers, model, step=1, epoch=1)
    payload = torch.load(path, weights_only=True)
    del payload["tokenizers"]
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="is an incomplete attn checkpoint: it has no 'tokenizers'"):
        load_checkpoint(path)


def test_a_file_that_is_not_a_whole_checkpoint_is_refused_saying_why(tmp_path):
    cfg, tokenizers, model = checkpoint_parts()
    whole = tmp_path / "whole.pt"
    save_checkpoint(whole, cfg, tokenizers, model, step=1, epoch=1)
    cases = {"empty.pt": b"", "notes.pt": b"some notes\n", "cut.pt": whole.read_bytes()[: whole.stat().st_size // 2]}
    reasons = {
        "empty.pt": "the file is empty",
        "notes.pt": "it is not a file torch.save wrote",
        "cut.pt": "it is cut short or damaged (",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(tmp_path / name)
        assert str(error.value).startswith(f"{tmp_path / name} is not a readable attn checkpoint: {reasons[name]}")
        assert "\n" not in str(error.value)


def test_a_tokenizer_write_that_fails_leaves_no_model_behind(tmp_path, monkeypatch):
    from attn_cli import files
    from attn_cli.files import WriteError

    _, tokenizers, _ = checkpoint_parts()

    def disk_full(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", disk_full)
    with pytest.raises(WriteError, match="joint.model: No space left on device"):
        tokenizers.save(tmp_path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # neither half a model nor its temporary file


CPU_ALLOCATOR_FAILURE = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.mark.parametrize(
    "error",
    [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), RuntimeError(CPU_ALLOCATOR_FAILURE)],
    ids=["cuda", "cpu"],
)
@pytest.mark.slow  # a training run
def test_a_step_out_of_memory_saves_last_pt_and_ends_in_one_line_of_advice(tmp_path, monkeypatch, error):
    from typer.testing import CliRunner

    from attn_cli.cli.app import app
    from attn_cli.training.step import TrainingStep

    real_step, calls = TrainingStep.__call__, []

    def third_step_runs_out_of_memory(self, batches):
        calls.append(len(batches))
        if len(calls) == 3:
            raise error
        return real_step(self, batches)

    monkeypatch.setattr(TrainingStep, "__call__", third_step_runs_out_of_memory)
    run_dir = tmp_path / "run"
    result = train_tiny(run_dir)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.output.splitlines()[-1] == errors[0]
    assert errors[0].startswith("error: out of memory on cpu: the batch of ") and " rows x " in errors[0]
    for advice in ("train.gradient_checkpointing: true", "lower train.max_tokens", "train.precision: bf16", "--resume"):
        assert advice in errors[0]
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert last.step == 2 and last.metrics["out_of_memory"]  # the state before the step that failed

    # The run continues from there with the advice taken.
    monkeypatch.setattr(TrainingStep, "__call__", real_step)
    resumed = CliRunner().invoke(
        app,
        [
            "train",
            "--config",
            str(run_dir / "config.yaml"),
            "--resume",
            "--set",
            "train.gradient_checkpointing=true",
            "--set",
            "train.max_steps=4",
        ],
    )
    assert resumed.exit_code == 0, resumed.output
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt").step == 4


def test_only_a_failed_allocation_counts_as_out_of_memory():
    from attn_cli.training.memory import is_out_of_memory

    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError(CPU_ALLOCATOR_FAILURE))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not is_out_of_memory(ValueError("out of memory"))
