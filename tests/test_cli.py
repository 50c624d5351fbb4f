"""End to end through the command line: train a tiny model, translate, evaluate."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from support.runs import train_tiny
from typer.testing import CliRunner

from attn_cli.cli.app import app


def invoke(*args, input=None):
    result = CliRunner().invoke(app, list(args), input=input)
    return result


def test_train_writes_config_tokenizer_splits_checkpoints_and_metrics(trained_run):
    for name in (
        "config.yaml",
        "tokenizer/joint.model",
        "data/test.en",
        "data/test.zh",
        "data/valid.en",
        "checkpoints/best.pt",
        "checkpoints/last.pt",
        "metrics.jsonl",
    ):
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
    assert oct(output.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as a plain open would make it

    # --output may name the --input file: it is replaced by the translations only once they are all written.
    in_place = invoke("translate", "--run", str(trained_run), "--input", str(source), "--output", str(source))
    assert in_place.exit_code == 0, in_place.output
    assert source.read_text().splitlines() == [lines[0], lines[2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "out.zh"]  # no temporary file left


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_an_interrupted_output_leaves_the_file_as_it_was(tmp_path):
    from attn_cli.decoding.io import output_stream

    target = tmp_path / "out.zh"
    target.write_text("what was there\n")
    with pytest.raises(KeyboardInterrupt):
        with output_stream(target) as out:
            out.write("half of the translations\n")
            raise KeyboardInterrupt
    assert target.read_text() == "what was there\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.zh"]

    from attn_cli.errors import UserError

    with pytest.raises(
        UserError, match=r"cannot write --output .*out.zh: No space left on device; the previous out.zh is intact"
    ):
        with output_stream(target) as out:
            raise OSError(28, "No space left on device")  # what a write to a full disk raises
    assert target.read_text() == "what was there\n" and [p.name for p in tmp_path.iterdir()] == ["out.zh"]
    with pytest.raises(FileNotFoundError):  # another file's error (an --attention-out, say) stays its own
        with output_stream(target) as out:
            raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "missing" / "attention.png"))
    assert target.read_text() == "what was there\n" and [p.name for p in tmp_path.iterdir()] == ["out.zh"]


def test_eval_scores_the_test_split_and_any_file_pair(trained_run, tmp_path):
    run = shutil.copytree(trained_run, tmp_path / "run")  # eval writes its hypotheses beside the checkpoint
    result = invoke("eval", "--bleu", "--run", str(run))
    assert result.exit_code == 0, result.output
    assert "BLEU = " in result.stdout and "tok:zh" in result.stdout and "chrF = " in result.stdout
    hypotheses = run / "checkpoints" / "best.test.en.hyp"
    assert len(hypotheses.read_text().splitlines()) == len((run / "data/test.en").read_text().splitlines())

    # Scoring the references against themselves through --src/--ref must not be mistaken for it.
    src, ref = tmp_path / "s.en", tmp_path / "r.zh"
    src.write_text("Hello.\nThank you.\n")
    ref.write_text("你好。\n谢谢。\n")
    custom = invoke("eval", "--run", str(run), "--src", str(src), "--ref", str(ref))
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
    config.write_text(
        "data:\n  corpus:\n    path: corpus.tsv\n  src_lang: en\n  tgt_lang: zh\n"
        "model:\n  d_model: 512\n  num_heads: 7\n"
    )
    result = invoke("train", "--config", str(config))
    assert result.exit_code == 2
    assert "model.num_heads: 7 must divide model.d_model=512" in result.output
    assert "Traceback" not in result.output


def test_console_script_shows_help_with_examples():
    result = subprocess.run([sys.executable, "-m", "attn_cli", "--help"], capture_output=True, text=True, check=True)
    assert "attn train --config en-zh.yaml" in result.stdout
    for command in ("train", "translate", "eval", "tokenizer", "average"):
        help_text = invoke(command, "--help").stdout
        assert "Example:" in help_text and f"attn {command}" in help_text, command


@pytest.mark.slow  # a training run
def test_ctrl_c_saves_the_last_checkpoint_and_says_where(tmp_path, monkeypatch):
    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.training.trainer import Trainer

    real_step = Trainer.train_step

    def interrupted_at_step_7(self, batch):
        if self.state.step == 7:
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_step_7)
    result = train_tiny(tmp_path)
    assert result.exit_code == 2
    assert f"the last checkpoint is in {tmp_path / 'checkpoints' / 'last.pt'}" in result.output
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt").step == 7


def test_training_into_a_finished_run_is_refused(trained_run, tmp_path):
    run = shutil.copytree(trained_run, tmp_path / "run")  # were it not refused, the training would replace it
    best = (run / "checkpoints" / "best.pt").read_bytes()
    result = train_tiny(run)
    assert result.exit_code == 2
    assert "already holds checkpoints" in result.output and "--set run_dir=" in result.output
    assert (run / "checkpoints" / "best.pt").read_bytes() == best


# --- translate: output formats, n-best, stdin, attention; eval with decode flags ---------------------

SENTENCES = ["Where is the station?", "Hello.", "I love machine learning"]


@pytest.fixture(scope="module")
def varied_checkpoint(trained_run, tmp_path_factory):
    """The tiny run's config and tokenizers with random, scaled-up weights: the trained tiny model
    translates every input to the same empty line, which would let a mixed-up order pass; these
    weights give each input its own output."""
    import torch

    from attn_cli.checkpoint import load_checkpoint, save_checkpoint
    from attn_cli.model import build_model

    loaded = load_checkpoint(trained_run / "checkpoints" / "best.pt")
    torch.manual_seed(0)
    model = build_model(loaded.config.model, loaded.tokenizers.source.vocab_size, loaded.tokenizers.target.vocab_size)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.mul_(3.0)
    path = tmp_path_factory.mktemp("varied") / "checkpoints" / "varied.pt"
    save_checkpoint(path, loaded.config, loaded.tokenizers, model, step=0, epoch=0)
    return path


def translate_ok(checkpoint, *args, input=None):
    result = invoke("translate", "--checkpoint", str(checkpoint), *args, input=input)
    assert result.exit_code == 0, result.output
    return result


def test_the_varied_checkpoint_translates_inputs_differently(varied_checkpoint):
    lines = translate_ok(varied_checkpoint, *SENTENCES).stdout.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 3


def test_jsonl_and_n_best_text_output_agree(varied_checkpoint):
    records = [
        json.loads(line)
        for line in translate_ok(
            varied_checkpoint, "--format", "jsonl", "--beam", "3", "--n-best", "2", *SENTENCES
        ).stdout.splitlines()
    ]
    assert [record["source"] for record in records] == SENTENCES
    for record in records:
        assert record["notes"] == []
        hypotheses = record["n_best"]
        assert len(hypotheses) == 2 and all(
            set(h) == {"translation", "score", "confidence", "tokens"} for h in hypotheses
        )
        assert all(
            isinstance(h["translation"], str) and isinstance(h["score"], float) and h["score"] < 0 for h in hypotheses
        )
        assert all(0 < h["confidence"] <= 1 for h in hypotheses)
        best = hypotheses[0]
        assert (record["translation"], record["score"], record["confidence"]) == (
            best["translation"],
            best["score"],
            best["confidence"],
        )
        assert all(h["tokens"] and all(isinstance(t, str) for t in h["tokens"]) for h in hypotheses)
        assert hypotheses[0]["score"] >= hypotheses[1]["score"]
        assert hypotheses[0]["tokens"] != hypotheses[1]["tokens"]

    # text: input<TAB>score<TAB>text, n lines per input, the same translations and scores
    lines = translate_ok(varied_checkpoint, "--beam", "3", "--n-best", "2", *SENTENCES).stdout.splitlines()
    rows = [line.split("\t", 2) for line in lines]
    assert [int(index) for index, _, _ in rows] == [0, 0, 1, 1, 2, 2]
    expected = [(h["score"], h["translation"]) for record in records for h in record["n_best"]]
    assert [(float(score), text) for _, score, text in rows] == expected

    # the best of an n-best list is what one translation per input gives
    plain = translate_ok(varied_checkpoint, "--beam", "3", *SENTENCES).stdout.splitlines()
    assert plain == [record["translation"] for record in records]


def test_stdin_gives_a_line_per_input_line_like_arguments(varied_checkpoint):
    from_arguments = translate_ok(varied_checkpoint, *SENTENCES).stdout
    from_stdin = translate_ok(varied_checkpoint, input="".join(s + "\n" for s in SENTENCES)).stdout
    assert from_stdin == from_arguments and len(from_stdin.splitlines()) == 3

    # n-best lines number the inputs across the lines read one by one; an empty line keeps its n lines
    n_best = translate_ok(
        varied_checkpoint, "--beam", "3", "--n-best", "2", input=f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n"
    )
    rows = [line.split("\t", 2) for line in n_best.stdout.splitlines()]
    assert [int(index) for index, _, _ in rows] == [0, 0, 1, 1, 2, 2]
    assert rows[2:4] == [["1", "0.0000", ""]] * 2
    from_arguments = translate_ok(varied_checkpoint, "--beam", "3", "--n-best", "2", *SENTENCES[:2]).stdout.splitlines()
    assert [row[1:] for row in rows[:2] + rows[4:]] == [line.split("\t", 2)[1:] for line in from_arguments]


def test_sampling_draws_n_best_samples_beyond_the_beam_repeatably(varied_checkpoint):
    args = ("--sample", "--n-best", "4", "--beam", "2", "--seed", "3", "--format", "jsonl", "Hello.")
    first = translate_ok(varied_checkpoint, *args).stdout
    assert first == translate_ok(varied_checkpoint, *args).stdout
    scores = [h["score"] for h in json.loads(first)["n_best"]]
    assert len(scores) == 4 and scores == sorted(scores, reverse=True)


def test_bad_decode_flags_are_one_line_naming_the_flags(varied_checkpoint):
    result = invoke("translate", "--checkpoint", str(varied_checkpoint), "--n-best", "4", "--beam", "2", "Hello.")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--n-best: 4 is more than --beam=2" in result.stderr
    assert "decode." not in result.stderr and "Traceback" not in result.output


def test_attention_out_matches_the_translation_tokens(varied_checkpoint, tmp_path):
    from attn_cli.checkpoint import load_checkpoint

    loaded = load_checkpoint(varied_checkpoint)
    layers, heads = loaded.config.model.decoder_layers, loaded.config.model.num_heads
    out = tmp_path / "attention.json"
    result = translate_ok(varied_checkpoint, "--format", "jsonl", "--attention-out", str(out), SENTENCES[0])
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]  # the "written to" note is on stderr
    assert f"attention weights written to {out}" in result.stderr
    saved = json.loads(out.read_text())
    tokens = record["n_best"][0]["tokens"]
    assert saved["source_tokens"] == loaded.tokenizers.source.encode_pieces([SENTENCES[0]])[0] + ["</s>"]
    assert saved["output_tokens"] == tokens + ["</s>"] and saved["decoder_input_tokens"] == ["<s>"] + tokens
    cross = torch_tensor(saved["cross"])
    assert list(cross.shape) == [layers, heads, len(tokens) + 1, len(saved["source_tokens"])]
    assert cross.sum(dim=-1).sub(1).abs().max() < 1e-4  # each query's weights over the source sum to 1

    # several sentences: one file each, numbered, each with its own source
    translate_ok(varied_checkpoint, "--attention-out", str(out), *SENTENCES[:2])
    for number, sentence in enumerate(SENTENCES[:2]):
        numbered = json.loads((tmp_path / f"attention.{number}.json").read_text())
        assert numbered["source_tokens"] == loaded.tokenizers.source.encode_pieces([sentence])[0] + ["</s>"]

    # stdin: numbered by input line too, across the batches lines arrive in
    piped = tmp_path / "piped" / "attention.json"
    translate_ok(varied_checkpoint, "--attention-out", str(piped), input="".join(s + "\n" for s in SENTENCES))
    for number, sentence in enumerate(SENTENCES):
        numbered = json.loads((piped.parent / f"attention.{number}.json").read_text())
        assert numbered["source_tokens"] == loaded.tokenizers.source.encode_pieces([sentence])[0] + ["</s>"]


def torch_tensor(values):
    import torch

    return torch.tensor(values)


def test_show_attention_draws_on_stderr_and_leaves_stdout_alone(varied_checkpoint):
    from attn_cli.checkpoint import load_checkpoint

    plain = translate_ok(varied_checkpoint, SENTENCES[1])
    shown = translate_ok(varied_checkpoint, "--show-attention", SENTENCES[1])
    assert shown.stdout == plain.stdout
    title, header, *rows, legend = shown.stderr.splitlines()
    assert title == "cross-attention, decoder layer 0 of 1, mean of 4 heads" and "≈0.5" in legend
    # a column per source piece and EOS, a row per output piece and EOS
    source = load_checkpoint(varied_checkpoint).tokenizers.source.encode_pieces([SENTENCES[1]])[0]
    assert header.split() == source + ["</s>"]
    (record,) = [
        json.loads(line)
        for line in translate_ok(varied_checkpoint, "--format", "jsonl", SENTENCES[1]).stdout.splitlines()
    ]
    assert [row.split()[0] for row in rows] == record["n_best"][0]["tokens"] + ["</s>"]
    assert all(len(row.split()) == len(source) + 2 for row in rows)
    one_head = translate_ok(varied_checkpoint, "--show-attention", "--attention-head", "2", SENTENCES[1])
    assert "cross-attention, decoder layer 0 of 1, head 2" in one_head.stderr


def test_an_attention_layer_the_model_lacks_is_a_one_line_error(varied_checkpoint):
    result = invoke(
        "translate", "--checkpoint", str(varied_checkpoint), "--show-attention", "--attention-layer", "99", "Hello."
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "--attention-layer 99: the model has 1 decoder layers" in result.stderr
    assert "Traceback" not in result.output


def test_eval_with_greedy_decoding_scores_what_translate_gives(trained_run, varied_checkpoint, tmp_path):
    run = shutil.copytree(trained_run, tmp_path / "run")  # eval writes its hypotheses beside the checkpoint
    result = invoke("eval", "--run", str(run), "--beam", "1")
    assert result.exit_code == 0, result.output
    assert "BLEU = " in result.stdout and "chrF = " in result.stdout

    # A config asking for 2 translations per input must not clash with --beam 1: eval scores the best.
    import dataclasses

    from attn_cli.checkpoint import load_checkpoint, save_checkpoint

    loaded = load_checkpoint(varied_checkpoint)
    config = dataclasses.replace(loaded.config, decode=dataclasses.replace(loaded.config.decode, n_best=2))
    checkpoint = tmp_path / "n_best.pt"
    save_checkpoint(checkpoint, config, loaded.tokenizers, loaded.model, step=0, epoch=0)
    src, ref = tmp_path / "s.en", tmp_path / "r.zh"
    src.write_text("".join(s + "\n" for s in SENTENCES))
    ref.write_text("车站在哪里？\n你好。\n我爱机器学习\n")
    scored = invoke("eval", "--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref), "--beam", "1")
    assert scored.exit_code == 0, scored.output
    assert "BLEU = " in scored.stdout
    hypotheses = (tmp_path / "n_best.s.en.hyp").read_text().splitlines()
    translated = translate_ok(checkpoint, "--beam", "1", "--n-best", "1", "--input", str(src)).stdout.splitlines()
    assert hypotheses == translated and len(set(translated)) == 3


# --- translate: prefixes; translate and eval: ensembles ----------------------------------------------


def test_translate_with_a_prefix_begins_every_translation_with_it(varied_checkpoint, tmp_path):
    plain = translate_ok(varied_checkpoint, *SENTENCES).stdout.splitlines()
    for beam in ("1", "3"):
        forced = translate_ok(varied_checkpoint, "--beam", beam, "--prefix", "我", *SENTENCES).stdout.splitlines()
        assert len(forced) == 3 and all(line.startswith("我") for line in forced) and forced != plain

    # JSONL input: each line's own prefix, --prefix for the lines without one; JSONL output names it
    source = tmp_path / "in.jsonl"
    source.write_text('{"source": "Hello.", "prefix": "你好"}\n{"source": "Where is the station?"}\n')
    result = translate_ok(
        varied_checkpoint, "--input-format", "jsonl", "--input", str(source), "--prefix", "我", "--format", "jsonl"
    )
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(record["source"], record["prefix"]) for record in records] == [
        ("Hello.", "你好"),
        ("Where is the station?", "我"),
    ]
    assert records[0]["translation"].startswith("你好")
    piped = translate_ok(varied_checkpoint, "--input-format", "jsonl", "--prefix", "我", input=source.read_text())
    assert piped.stdout.splitlines() == [record["translation"] for record in records]

    source.write_text('{"source": "Hello."}\nHello.\n')
    bad = invoke("translate", "--checkpoint", str(varied_checkpoint), "--input-format", "jsonl", "--input", str(source))
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
    assert f"{source} line 2: not JSON" in bad.stderr and "Traceback" not in bad.output


@pytest.fixture(scope="module")
def foreign_checkpoint(varied_checkpoint, tmp_path_factory):
    """The varied checkpoint's config with a tokenizer of its own, trained on made-up words."""
    from attn_cli.checkpoint import load_checkpoint, save_checkpoint
    from attn_cli.config import TokenizerConfig
    from attn_cli.data.tokenizer import Tokenizers, train_sentencepiece
    from attn_cli.model import build_model

    loaded = load_checkpoint(varied_checkpoint)
    words = [a + b + c for a in "abcdefghij" for b in "abcdefghij" for c in "abcdefghij"]
    tokenizer = train_sentencepiece(
        [" ".join(words[i : i + 6]) for i in range(0, len(words), 6)], TokenizerConfig(vocab_size=300)
    )
    path = tmp_path_factory.mktemp("foreign") / "foreign.pt"
    save_checkpoint(
        path,
        loaded.config,
        Tokenizers(tokenizer, tokenizer),
        build_model(loaded.config.model, 300, 300),
        step=0,
        epoch=0,
    )
    return path


@pytest.mark.slow  # six translations and two evaluations
def test_translate_and_eval_decode_with_an_ensemble_of_checkpoints(trained_run, varied_checkpoint, tmp_path):
    trained = trained_run / "checkpoints" / "best.pt"
    for beam in ("1", "3"):
        alone = translate_ok(varied_checkpoint, "--beam", beam, *SENTENCES).stdout
        with_itself = translate_ok(
            varied_checkpoint, "--checkpoint", str(varied_checkpoint), "--beam", beam, *SENTENCES
        )
        assert with_itself.stdout == alone
        pair = translate_ok(varied_checkpoint, "--checkpoint", str(trained), "--beam", beam, *SENTENCES).stdout
        assert len(pair.splitlines()) == 3
    runs = invoke("translate", "--run", str(trained_run), "--run", str(trained_run), *SENTENCES)
    assert runs.exit_code == 0, runs.output
    assert runs.stdout == invoke("translate", "--run", str(trained_run), *SENTENCES).stdout

    src, ref = tmp_path / "s.en", tmp_path / "r.zh"
    src.write_text("".join(s + "\n" for s in SENTENCES))
    ref.write_text("车站在哪里？\n你好。\n我爱机器学习\n")
    scored = invoke(
        "eval",
        "--checkpoint",
        str(varied_checkpoint),
        "--checkpoint",
        str(trained),
        "--src",
        str(src),
        "--ref",
        str(ref),
        "--beam",
        "1",
    )
    assert scored.exit_code == 0, scored.output
    assert "BLEU = " in scored.stdout
    hypotheses = varied_checkpoint.with_name("varied+best.s.en.hyp").read_text().splitlines()
    translated = translate_ok(varied_checkpoint, "--checkpoint", str(trained), "--beam", "1", "--input", str(src))
    assert hypotheses == translated.stdout.splitlines()


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["--show-attention"],
            "--show-attention/--attention-out: an ensemble of 2 checkpoints gives no one model's attention weights; "
            "give one --run or --checkpoint",
        ),
        (["--model", "exported"], "--model and --checkpoint each name a model"),
    ],
)
def test_translate_single_model_features_refuse_an_ensemble_in_one_line(varied_checkpoint, extra, message):
    result = invoke(
        "translate", "--checkpoint", str(varied_checkpoint), "--checkpoint", str(varied_checkpoint), *extra, "Hello."
    )
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr and "Traceback" not in result.output


def test_translate_refuses_an_ensemble_of_checkpoints_with_different_tokenizers(varied_checkpoint, foreign_checkpoint):
    result = invoke(
        "translate", "--checkpoint", str(varied_checkpoint), "--checkpoint", str(foreign_checkpoint), "Hello."
    )
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"{varied_checkpoint} and {foreign_checkpoint} use different tokenizers" in result.stderr
    assert "ensemble checkpoints that share one" in result.stderr


@pytest.mark.slow  # a training run
def test_nonfinite_losses_in_a_row_stop_the_run_with_advice(tmp_path, monkeypatch):
    from attn_cli.training import step as training_step

    real_loss = training_step.projected_label_smoothed_loss
    monkeypatch.setattr(training_step, "projected_label_smoothed_loss", lambda *args: real_loss(*args) * float("inf"))
    result = train_tiny(tmp_path, "train.max_nonfinite_steps=3")
    assert result.exit_code == 2
    assert "3 steps in a row had a non-finite loss" in result.output and "lower train.lr" in result.output
    assert "Traceback" not in result.output


def test_average_writes_a_checkpoint_that_translate_accepts_and_refuses_too_few(trained_run, tmp_path):
    run = shutil.copytree(trained_run, tmp_path / "run")  # the average is written into the run
    too_many = invoke("average", "--run", str(run), "--last", "2")
    assert too_many.exit_code == 2
    assert "--last 2 needs 2 step checkpoints" in too_many.output and "holds 1 (step-000040.pt)" in too_many.output
    assert "train.keep_last" in too_many.output

    result = invoke("average", "--run", str(run), "--last", "1")
    assert result.exit_code == 0, result.output
    averaged = run / "checkpoints" / "average-last1.pt"
    translated = invoke("translate", "--checkpoint", str(averaged), "Hello.")
    assert translated.exit_code == 0, translated.output
    # One checkpoint averaged is that checkpoint: the same translation as step 40's own.
    own = invoke("translate", "--checkpoint", str(run / "checkpoints" / "step-000040.pt"), "Hello.")
    assert translated.stdout == own.stdout


def test_a_second_training_in_a_run_directory_in_use_is_refused_with_the_holders_pid(tmp_path):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from attn_cli.paths import RunPaths\n"
                "from attn_cli.training.guards import run_directory_lock\n"
                "with run_directory_lock(RunPaths.of(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)"
            ),
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for command in ("train", "tokenizer"):
            result = invoke(command, "--config", "tiny.yaml", "--set", f"run_dir={tmp_path}")
            assert result.exit_code == 2
            assert f"is in use by another attn process (PID {holder.pid})" in result.output
            assert sorted(os.listdir(tmp_path)) == [".lock"], "the refused command must write nothing"
    finally:
        holder.kill()
        holder.wait()
    from attn_cli.paths import RunPaths
    from attn_cli.training.guards import run_directory_lock

    with run_directory_lock(RunPaths.of(tmp_path)):  # the kernel released the dead holder's lock
        pass


def test_a_run_directory_that_cannot_be_one_is_a_one_line_error(tmp_path):
    (tmp_path / "a-file").write_text("not a directory\n")
    result = train_tiny(tmp_path / "a-file")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"run_dir: {tmp_path / 'a-file'} cannot be a run directory: File exists; give another path" in result.output


@pytest.mark.slow  # a training run
def test_every_checkpoint_is_published_after_its_metrics_line_and_stale_temporaries_go(tmp_path, monkeypatch):
    import json

    from attn_cli.training import trainer

    original, saved_steps, saved = trainer.save_checkpoint, [], []

    def checked_save(path, config, tokenizers, model, step, epoch, metrics, training_state, lengths):
        if metrics:  # a validation's checkpoint: its line must be in the log already
            lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
            assert any(line.get("step") == step and "valid_loss" in line for line in lines), step
            saved_steps.append(step)
        saved.append((step, path.name))
        return original(path, config, tokenizers, model, step, epoch, metrics, training_state, lengths)

    monkeypatch.setattr(trainer, "save_checkpoint", checked_save)
    # What kills in the middle of writes leave.
    stale = [
        tmp_path / "checkpoints" / ".last.pt.123.tmp",
        tmp_path / "tokenizer" / ".joint.model.123.tmp",
        tmp_path / "data" / ".valid.en.123.tmp",
        tmp_path / ".config.yaml.123.tmp",
    ]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a file")
    result = train_tiny(tmp_path, "train.max_steps=20", "train.valid_every=10", "train.keep_last=2")
    assert result.exit_code == 0, result.output
    assert sorted(set(saved_steps)) == [10, 20]
    # last.pt, which marks a validation as done for a resume, comes after the validation's other files.
    for step in (10, 20):
        names = [name for saved_step, name in saved if saved_step == step]
        assert names[-1] == "last.pt" and f"step-{step:06d}.pt" in names[:-1], names
    assert not [path for path in stale if path.exists()]


def test_bytes_that_are_not_utf8_are_named_by_line_and_the_other_lines_still_translate(trained_run):
    good = invoke("translate", "--run", str(trained_run), input="Hello.\nGood.\n")
    assert good.exit_code == 0, good.output
    piped = invoke("translate", "--run", str(trained_run), input=b"Hello.\n\xff\xfe broken\nGood.\n")
    assert piped.exit_code == 0, piped.output
    lines = piped.stdout.splitlines()
    assert len(lines) == 3 and [lines[0], lines[2]] == good.stdout.splitlines()
    assert "warning: stdin line 2: bytes that are not UTF-8 were replaced with U+FFFD" in piped.output
    # An argument with such bytes reaches Python as lone surrogates (surrogateescape).
    argued = invoke("translate", "--run", str(trained_run), "Hello.", "broken \udcff\udcfe")
    assert argued.exit_code == 0, argued.output
    assert argued.stdout.splitlines()[0] == lines[0]
    assert "warning: argument line 2:" in argued.output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.slow  # a process of its own
def test_a_full_stdout_is_one_line(trained_run):
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "attn_cli", "translate", "--run", str(trained_run), "Hello."],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot write the translations to stdout: No space left on device" in result.stderr


def test_a_refusal_in_the_moment_before_the_holder_writes_its_pid_still_names_it(tmp_path):
    import fcntl
    import threading

    from attn_cli.config import ConfigError
    from attn_cli.paths import RunPaths
    from attn_cli.training.guards import run_directory_lock

    with open(tmp_path / ".lock", "a+", encoding="utf-8") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, its PID not written yet
        writer = threading.Timer(0.1, lambda: (holder.write("4242\n"), holder.flush()))
        writer.start()
        with pytest.raises(ConfigError, match=r"another attn process \(PID 4242\)"):
            with run_directory_lock(RunPaths.of(tmp_path)):
                pass
        writer.join()


@pytest.mark.parametrize("command, extra", [(["serve"], "serve"), (["export"], "ct2"), (["import", "hf"], "hf")])
def test_help_names_the_extra_to_install_whole(command, extra):
    """Rich reads [serve] as markup unless it is escaped: the help must print it."""
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert f'"attn-cli[{extra}]"' in result.output
