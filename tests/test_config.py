"""Bad configs fail before any work, naming the key and the fix."""

from pathlib import Path

import pytest

from attn_cli.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


CORPUS = "data:\n  corpus:\n    path: corpus.tsv\n"


def write(tmp_path, text: str) -> Path:
    """A config file of `text`, with a corpus path unless `text` has a data section of its own."""
    path = tmp_path / "config.yaml"
    path.write_text(text if text.startswith("data:") else CORPUS + text)
    return path


@pytest.mark.parametrize("name", ["en-zh.yaml", "tiny.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.data.corpus.path.endswith("cmn.txt")


@pytest.mark.parametrize("text, expected", [
    ("model:\n  d_model: 512\n  num_heads: 7\n", "model.num_heads: 7 must divide model.d_model=512"),
    ("model:\n  d_modle: 512\n", "model.d_modle: unknown key; did you mean 'd_model'?"),
    ("train:\n  lr: fast\n", "train.lr: 'fast' must be a number"),
    ("train:\n  precision: fp8\n", "train.precision: 'fp8' is not one of"),
    ("data:\n  corpus:\n    format: text\n", "data.corpus: format 'text' needs both src_path and tgt_path"),
    ("model:\n  dropout: 1.5\n", "model.dropout: 1.5 must be in [0, 1)"),
    ("tokenizer:\n  joint: false\n", "model.share_embeddings: true needs tokenizer.joint=true"),
    ("bogus: 1\n", "bogus: unknown key"),
    ("data:\n  corpus:\n    format: tsv\n", "data.corpus.path: format 'tsv' needs a file path"),
    ("train:\n  max_steps: true\n", "train.max_steps: True must be a whole number"),
])
def test_bad_values_name_the_yaml_path(tmp_path, text, expected):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert expected in str(error.value)
    assert str(tmp_path / "config.yaml") in str(error.value)


def test_overrides_apply_and_are_validated(tmp_path):
    path = write(tmp_path, "model:\n  d_model: 64\n  num_heads: 4\n")
    cfg = load_config(path, ["model.num_heads=8", "train.betas=[0.9, 0.99]", "run_dir=elsewhere"])
    assert (cfg.model.num_heads, cfg.train.betas, cfg.run_dir) == (8, (0.9, 0.99), "elsewhere")
    with pytest.raises(ConfigError, match="model.num_heads: 6 must divide model.d_model=64"):
        load_config(path, ["model.num_heads=6"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(path, ["model.num_heads"])


def test_missing_config_file_says_where_to_look(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_overrides_parse_exponents_and_reject_broken_yaml(tmp_path):
    path = write(tmp_path, "")
    assert load_config(path, ["train.lr=7e-4"]).train.lr == 7e-4
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path, ["train.betas=[0.9,"])
    with pytest.raises(ConfigError, match="train.device: 'gpu' is not a device"):
        load_config(path, ["train.device=gpu"])


def test_device_option_is_checked_with_its_name():
    from attn_cli.training.setup import resolve_device

    with pytest.raises(ConfigError, match="--device: 'gpu' is not a device"):
        resolve_device("gpu", "--device")
    assert resolve_device("cpu").type == "cpu"
