"""Bad configs fail before any work, naming the key and the fix."""

from pathlib import Path

import pytest
from support.runs import REPO

from attn_cli.config import ConfigError, DecodeConfig, builtin_configs, find_config, load_config

CORPUS = "data:\n  corpus:\n    path: corpus.tsv\n  src_lang: en\n  tgt_lang: zh\n"


def write(tmp_path, text: str) -> Path:
    """A config file of `text`, with a corpus path unless `text` has a data section of its own."""
    path = tmp_path / "config.yaml"
    path.write_text(text if text.startswith("data:") else CORPUS + text)
    return path


@pytest.mark.parametrize("name", ["en-zh.yaml", "tiny.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.data.corpus.path == "builtin:tatoeba-cmn-eng"


def test_the_repositorys_configs_are_the_built_in_ones():
    assert sorted(builtin_configs()) == sorted(path.name for path in (REPO / "configs").glob("*.yaml"))
    for name, packaged in builtin_configs().items():
        assert packaged.read_text(encoding="utf-8") == (REPO / "configs" / name).read_text(encoding="utf-8"), name


@pytest.mark.parametrize("name", ["tiny.yaml", "tiny"])
def test_a_built_in_config_is_found_by_name_from_any_directory(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert find_config(name) == builtin_configs()["tiny.yaml"]
    assert load_config(name).model.d_model == 32
    (tmp_path / "tiny.yaml").write_text("model:\n  d_model: 64\n  num_heads: 4\n" + CORPUS)
    assert load_config("tiny.yaml").model.d_model == 64  # a file of that name here comes first


def test_an_unknown_config_name_lists_the_built_in_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError,
        match="config file not found: nope.yaml; the built-in configs are en-zh.yaml, student.yaml, tiny.yaml",
    ):
        load_config("nope.yaml")


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "train:\n  seed: 123456789012345678901\n",
            "train.seed: 123456789012345678901 is out of range; a seed is a whole number from 0 to",
        ),
        ("data:\n  corpus:\n    path: c.tsv\n  split_seed: -1\n", "data.split_seed: -1 is out of range"),
        ("decode:\n  seed: 4294967296\n", "decode.seed: 4294967296 is out of range"),
        ("model:\n  d_model: 512\n  num_heads: 7\n", "model.num_heads: 7 must divide model.d_model=512"),
        ("model:\n  d_modle: 512\n", "model.d_modle: unknown key; did you mean 'd_model'?"),
        ("train:\n  lr: fast\n", "train.lr: 'fast' must be a number"),
        ("train:\n  precision: fp8\n", "train.precision: 'fp8' is not one of"),
        ("model:\n  activation: swish\n", "model.activation: 'swish' is not one of 'relu', 'gelu', 'silu'"),
        (
            "model:\n  positions: learned\n  sinusoid_layout: halves\n",
            "model.sinusoid_layout: halves orders sinusoidal positions, and model.positions is learned",
        ),
        ("data:\n  corpus:\n    format: text\n", "data.corpus: format 'text' needs both src_path and tgt_path"),
        ("model:\n  dropout: 1.5\n", "model.dropout: 1.5 must be in [0, 1)"),
        ("tokenizer:\n  joint: false\n", "model.share_embeddings: true needs tokenizer.joint=true"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("data:\n  corpus:\n    format: tsv\n", "data.corpus.path: format 'tsv' needs a file path"),
        ("train:\n  max_steps: true\n", "train.max_steps: True must be a whole number"),
        ("train:\n  join:\n    rate: 1.5\n", "train.join.rate: 1.5 must be in [0, 1]"),
        ("train:\n  join:\n    max_pairs: 1\n", "train.join.max_pairs: 1 must be >= 2"),
        (
            "model:\n  positions: learned\n  max_positions: 100\ntrain:\n  join:\n    rate: 0.1\n    max_tokens: 120\n",
            "model.max_positions: 100 is shorter than the longest sentence data.max_*_tokens "
            "(or train.join.max_tokens) + 1 = 121",
        ),
        # Every number has a range: no NaN or infinity, nothing beyond 64 bits, and sizes that exist.
        ("train:\n  lr: .nan\n", "train.lr: nan is not a usable number; give a finite one"),
        ("train:\n  max_minutes: .inf\n", "train.max_minutes: inf is not a usable number"),
        ("train:\n  betas: [0.9, .nan]\n", "train.betas[1]: nan is not a usable number"),
        ("decode:\n  max_len_a: .inf\n", "decode.max_len_a: inf is not a usable number"),
        (
            "model:\n  max_positions: 100000000000000000000\n",
            "model.max_positions: 100000000000000000000 is out of range; "
            "whole numbers here go up to 9,223,372,036,854,775,807",
        ),
        ("model:\n  max_positions: 2000000\n", "model.max_positions: 2,000,000 is more than 1,048,576"),
        ("tokenizer:\n  vocab_size: 100000000000\n", "tokenizer.vocab_size: 100,000,000,000 is more than 1,000,000"),
        ("train:\n  threads: 5000\n", "train.threads: 5,000 is more than 1,024"),
        ("train:\n  weight_decay: -0.1\n", "train.weight_decay: -0.1 must be >= 0"),
        ("decode:\n  beam_size: 100000000\n", "decode.beam_size: 100,000,000 is more than 1,024"),
        ("decode:\n  max_len_b: 1000000000\n", "decode.max_len_b: 1,000,000,000 is more than 100,000"),
        ("decode:\n  length_penalty: -1\n", "decode.length_penalty: -1.0 must be >= 0"),
        ("decode:\n  no_repeat_ngram: -2\n", "decode.no_repeat_ngram: -2 must be >= 0"),
    ],
)
def test_bad_values_name_the_yaml_path(tmp_path, text, expected):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert expected in str(error.value)
    assert str(tmp_path / "config.yaml") in str(error.value)


def test_a_file_that_is_not_yaml_text_is_one_line_saying_where(tmp_path):
    tabbed = write(tmp_path, "model:\n\td_model: 64\n")
    with pytest.raises(
        ConfigError,
        match=r"config.yaml: not valid YAML at line 7, column 1: found character '\\t' "
        r"that cannot start any token$",
    ):
        load_config(tabbed)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"model:\n  d_model: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"binary.yaml: not UTF-8 text \(byte 18\); a config is a YAML text file$"):
        load_config(binary)


def test_an_error_keeps_its_key_apart_from_the_problem(tmp_path):
    path = write(tmp_path, "model:\n  d_model: 64\n  num_heads: 6\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert (error.value.key, error.value.config_file) == ("model.num_heads", path)
    assert error.value.problem == "6 must divide model.d_model=64"
    assert str(error.value) == f"{path}: model.num_heads: 6 must divide model.d_model=64"
    assert error.value.describe({"model.num_heads": "--heads"}) == f"{path}: --heads: 6 must divide model.d_model=64"


def test_a_setting_named_in_a_problem_can_be_renamed_like_the_key():
    with pytest.raises(ConfigError) as error:
        DecodeConfig(beam_size=2, n_best=4).validate("decode")
    assert error.value.key == "decode.n_best" and error.value.mentions == {"beam_size": "decode.beam_size"}
    assert str(error.value) == (
        "decode.n_best: 4 is more than beam_size=2; a beam of k keeps at most k translations, so raise beam_size"
    )
    renamed = error.value.describe({"decode.n_best": "-n", "decode.beam_size": "-b"})
    assert renamed == "-n: 4 is more than -b=2; a beam of k keeps at most k translations, so raise -b"
    with pytest.raises(ConfigError) as error:  # a problem of the whole section: its key can be left out
        DecodeConfig(max_len_b=0).validate("decode")
    assert str(error.value) == "decode: max_len_a=1.5 must be >= 0 and max_len_b=0 >= 1"
    assert error.value.describe({"decode": None}) == "max_len_a=1.5 must be >= 0 and max_len_b=0 >= 1"


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
    from attn_cli.device import resolve_device

    with pytest.raises(ConfigError, match="--device: 'gpu' is not a device"):
        resolve_device("gpu", "--device")
    assert resolve_device("cpu").type == "cpu"


def test_train_lists_the_built_in_configs():
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    result = CliRunner().invoke(app, ["train", "--list-configs"])
    assert result.exit_code == 0
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == list(builtin_configs())


def test_joined_pairs_set_the_longest_training_example_when_joining_is_on(tmp_path):
    from attn_cli.training.memory import worst_batch

    plain = load_config(
        write(
            tmp_path,
            "data:\n  corpus:\n    path: c.tsv\n  src_lang: en\n  tgt_lang: zh\n  max_source_tokens: 50\n"
            "  max_target_tokens: 40\ntrain:\n  max_tokens: 1000\n"
            "  join:\n    max_tokens: 99\n",
        )
    )
    assert plain.longest_training_sides() == (50, 40)  # rate 0: no pair is joined
    joined = load_config(
        write(
            tmp_path,
            "data:\n  corpus:\n    path: c.tsv\n  src_lang: en\n  tgt_lang: zh\n  max_source_tokens: 50\n"
            "train:\n  max_tokens: 1000\n  join:\n    rate: 0.2\n    max_tokens: 99\n",
        )
    )
    assert joined.longest_training_sides() == (99, 99)
    assert (worst_batch(plain).rows, worst_batch(plain).source_length) == (1000 // 51, 51)
    assert (worst_batch(joined).rows, worst_batch(joined).source_length) == (1000 // 100, 100)


def test_a_corpus_other_than_the_built_in_one_names_its_languages(tmp_path):
    """No silent en/zh for a German-English corpus: the BLEU tokenizer and joining depend on them."""
    config = tmp_path / "de-en.yaml"
    config.write_text("data:\n  corpus:\n    path: de-en.tsv\n  tgt_lang: en\n")
    with pytest.raises(
        ConfigError, match=r"data.src_lang: the corpus \(de-en.tsv\) is not the built-in .* src_lang: de"
    ):
        load_config(config)
    assert load_config(config, ["data.src_lang=de"]).data.languages == ("de", "en")
    assert load_config(None, ["data.corpus.path=builtin:tatoeba-cmn-eng"]).data.languages == ("en", "zh")
