"""`attn distill`: a teacher translates its own training sources (never its validation or test ones)
into a corpus, each as `attn translate` gives it, and the student config written beside it trains
on that corpus and is scored on the teacher's test split."""

import shutil

import pytest
import torch
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.config import CorpusConfig, builtin_configs, load_config
from attn_cli.data.corpus import read_corpus

GREEDY = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "8"]


def cli(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def teacher(trained_run, tmp_path_factory):
    """The tiny run with its weights stirred: a tiny trained model ends most outputs at once, a
    random one writes something for every source."""
    from attn_cli.checkpoint import load_checkpoint, save_checkpoint

    run = tmp_path_factory.mktemp("teacher") / "run"
    shutil.copytree(trained_run, run)
    best = run / "checkpoints" / "best.pt"
    loaded = load_checkpoint(best)
    torch.manual_seed(3)
    for parameter in loaded.model.parameters():
        parameter.data.add_(torch.randn_like(parameter) * 0.5)
    save_checkpoint(best, loaded.config, loaded.tokenizers, loaded.model, step=1, epoch=1)
    return run


@pytest.mark.slow  # a thousand sources translated, a student trained
def test_the_teacher_translates_its_training_sources_into_a_corpus_and_a_student_config(teacher, tmp_path):
    from attn_cli.config import DecodeConfig
    from attn_cli.data.split import split_corpus
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    output, student = tmp_path / "distilled.tsv", tmp_path / "student.yaml"
    args = ["distill", "--run", teacher, "-o", output, "--student-config", student, "--original-weight", "0.5"]
    result = cli(*args, *GREEDY, "--student-run", tmp_path / "student")
    assert result.exit_code == 0, result.output

    config = load_config(teacher / "config.yaml")
    training = [" ".join(source.split()) for source, _ in split_corpus(config.data).train_pairs()]
    sources = (tmp_path / "distilled.tsv.sources").read_text(encoding="utf-8").splitlines()
    assert sources == training
    held_out = {
        line for split in ("valid", "test") for line in (teacher / "data" / f"{split}.en").read_text().splitlines()
    }
    assert held_out and not held_out & set(sources)

    engine = load_engine([teacher], [], None, "cpu")
    options = DecodeConfig(**{**engine.config.decode.__dict__, "beam_size": 1, "max_len_a": 0.0, "max_len_b": 8})
    texts = [" ".join(t.text.split()) for t in translate(engine, [Source(s) for s in sources], options)]
    expected = [(source, text) for source, text in zip(sources, texts) if text]
    assert len(expected) > 0.9 * len(sources)
    assert read_corpus(CorpusConfig(path=str(output))) == expected

    trained = cli("train", "--config", student, "--set", "train.max_steps=2", "--set", "train.valid_bleu=false")
    assert trained.exit_code == 0, trained.output
    student_config = load_config(student)
    assert student_config.model == load_config(builtin_configs()["student.yaml"]).model  # the built-in shape
    assert student_config.decode == load_config(builtin_configs()["student.yaml"]).decode
    assert [(c.label, c.weight, c.split) for c in student_config.data.corpora] == [
        ("distilled", 1.0, False),
        ("tatoeba-cmn-eng", 0.5, False),
    ]
    for split in ("valid", "test"):  # scored on the teacher's held-out sentences
        for language in ("en", "zh"):
            name = f"{split}.{language}"
            assert (tmp_path / "student" / "data" / name).read_bytes() == (teacher / "data" / name).read_bytes()


def test_a_language_the_teacher_does_not_write_is_refused(tmp_path, teacher):
    from attn_cli.checkpoint import load_checkpoint

    loaded = load_checkpoint(teacher / "checkpoints" / "best.pt")
    assert not loaded.tokenizers.multi_target
    refused = cli("distill", "--run", teacher, "-o", tmp_path / "d.tsv", "--target", "de", *GREEDY)
    assert refused.exit_code != 0 and "does not translate into 'de'; it translates into zh" in refused.output
