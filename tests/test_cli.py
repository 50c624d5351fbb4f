"""End to end through the command line: train a tiny model, translate, evaluate."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attn_cli.cli import app

from conftest import CORPUS, REPO

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"corpus not found at {CORPUS}")


def invoke(*args, input=None):
    result = CliRunner().invoke(app, list(args), input=input)
    return result


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One tiny training run shared by the tests below."""
    run_dir = tmp_path_factory.mktemp("run")
    cwd = os.getcwd()
    os.chdir(REPO)  # the config's corpus path is relative to the repository root
    try:
        result = invoke("train", "--config", "configs/tiny.yaml", "--set", f"run_dir={run_dir}",
                        "--set", "train.keep_last=1")
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return run_dir


def test_train_writes_config_tokenizer_splits_checkpoints_and_metrics(trained_run):
    for name in ("config.yaml", "tokenizer/joint.model", "data/test.en", "data/test.zh", "data/valid.en",
                 "checkpoints/best.pt", "checkpoints/last.pt", "metrics.jsonl"):
        assert (trained_run / name).is_file(), name
    # train.keep_last=1: the step checkpoint of step 20 made way for that of step 40.
    assert sorted(p.name for p in (trained_run / "checkpoints").glob("step-*.pt")) == ["step-000040.pt"]
    metrics = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [20, 40]
    assert metrics[-1]["valid_loss"] < metrics[0]["valid_loss"]
    assert len((trained_run / "data/test.en").read_text().splitlines()) >= 50


def test_translate_arguments_stdin_and_files(trained_run, tmp_path):
    result = invoke("translate", "--run", str(trained_run), "I love machine learning", "Hello.")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2

    piped = invoke("translate", "--run", str(trained_run), input="Hello.\n\nI love machine learning\n")
    assert piped.exit_code == 0, piped.output
    lines = piped.stdout.splitlines()
    assert len(lines) == 3 and lines[1] == ""  # an empty line gives an empty line
    assert lines[0] == result.stdout.splitlines()[1] and lines[2] == result.stdout.splitlines()[0]

    source = tmp_path / "in.en"
    source.write_text("Hello.\nI love machine learning\n")
    output = tmp_path / "out.zh"
    from_file = invoke("translate", "--run", str(trained_run), "--input", str(source), "--output", str(output))
    assert from_file.exit_code == 0, from_file.output
    assert output.read_text().splitlines() == [lines[0], lines[2]]


def test_eval_scores_the_test_split_and_any_file_pair(trained_run, tmp_path):
    result = invoke("eval", "--bleu", "--run", str(trained_run))
    assert result.exit_code == 0, result.output
    assert "BLEU = " in result.stdout and "tok:zh" in result.stdout and "chrF = " in result.stdout
    hypotheses = trained_run / "checkpoints" / "best.test.en.hyp"
    assert len(hypotheses.read_text().splitlines()) == len((trained_run / "data/test.en").read_text().splitlines())

    # Scoring the references against themselves through --src/--ref must not be mistaken for it.
    src, ref = tmp_path / "s.en", tmp_path / "r.zh"
    src.write_text("Hello.\nThank you.\n")
    ref.write_text("你好。\n谢谢。\n")
    custom = invoke("eval", "--run", str(trained_run), "--src", str(src), "--ref", str(ref))
    assert custom.exit_code == 0, custom.output
    assert "BLEU = " in custom.stdout


def test_missing_checkpoint_says_where_it_looked_and_how_to_make_one(tmp_path):
    result = invoke("translate", "--run", str(tmp_path / "nothing"), "Hello")
    assert result.exit_code == 2
    assert str(tmp_path / "nothing" / "checkpoints") in result.output
    assert "attn train --config" in result.output
    assert "Traceback" not in result.output


def test_bad_config_is_one_line_naming_the_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("data:\n  corpus:\n    path: corpus.tsv\nmodel:\n  d_model: 512\n  num_heads: 7\n")
    result = invoke("train", "--config", str(config))
    assert result.exit_code == 2
    assert "model.num_heads: 7 must divide model.d_model=512" in result.output
    assert "Traceback" not in result.output


def test_console_script_shows_help_with_examples():
    result = subprocess.run([sys.executable, "-m", "attn_cli", "--help"], capture_output=True, text=True, check=True)
    assert "attn train --config configs/en-zh.yaml" in result.stdout
    for command in ("train", "translate", "eval", "tokenizer", "average"):
        help_text = invoke(command, "--help").stdout
        assert "Example:" in help_text and f"attn {command}" in help_text, command


def test_ctrl_c_saves_the_last_checkpoint_and_says_where(tmp_path, monkeypatch):
    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.train import Trainer

    real_step = Trainer.train_step

    def interrupted_at_step_7(self, batch):
        if self.step == 7:
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_step_7)
    monkeypatch.chdir(REPO)
    result = invoke("train", "--config", "configs/tiny.yaml", "--set", f"run_dir={tmp_path}")
    assert result.exit_code == 2
    assert f"the last checkpoint is in {tmp_path / 'checkpoints' / 'last.pt'}" in result.output
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt").step == 7


def test_training_into_a_finished_run_is_refused(trained_run):
    best = (trained_run / "checkpoints" / "best.pt").read_bytes()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        result = invoke("train", "--config", "configs/tiny.yaml", "--set", f"run_dir={trained_run}")
    finally:
        os.chdir(cwd)
    assert result.exit_code == 2
    assert "already holds checkpoints" in result.output and "--set run_dir=" in result.output
    assert (trained_run / "checkpoints" / "best.pt").read_bytes() == best


def test_nonfinite_losses_in_a_row_stop_the_run_with_advice(tmp_path, monkeypatch):
    from attn_cli import training_step

    real_loss = training_step.label_smoothed_loss
    monkeypatch.setattr(training_step, "label_smoothed_loss",
                        lambda *args: (real_loss(*args)[0] * float("inf"), real_loss(*args)[1]))
    monkeypatch.chdir(REPO)
    result = invoke("train", "--config", "configs/tiny.yaml", "--set", f"run_dir={tmp_path}",
                    "--set", "train.max_nonfinite_steps=3")
    assert result.exit_code == 2
    assert "3 steps in a row had a non-finite loss" in result.output and "lower train.lr" in result.output
    assert "Traceback" not in result.output


def test_average_writes_a_checkpoint_that_translate_accepts_and_refuses_too_few(trained_run):
    too_many = invoke("average", "--run", str(trained_run), "--last", "2")
    assert too_many.exit_code == 2
    assert "--last 2 needs 2 step checkpoints" in too_many.output and "holds 1 (step-000040.pt)" in too_many.output
    assert "train.keep_last" in too_many.output

    result = invoke("average", "--run", str(trained_run), "--last", "1")
    assert result.exit_code == 0, result.output
    averaged = trained_run / "checkpoints" / "average-last1.pt"
    translated = invoke("translate", "--checkpoint", str(averaged), "Hello.")
    assert translated.exit_code == 0, translated.output
    # One checkpoint averaged is that checkpoint: the same translation as step 40's own.
    own = invoke("translate", "--checkpoint", str(trained_run / "checkpoints" / "step-000040.pt"), "Hello.")
    assert translated.stdout == own.stdout
