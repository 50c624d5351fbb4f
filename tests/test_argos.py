"""attn export --format argos: a package that Argos Translate installs, and that translates there
as `attn translate --model` does with the same CTranslate2 model."""

import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
from support.runs import checkpoint_parts, train_tiny
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.export.argos import argos_code, language_name

pytest.importorskip("ctranslate2")
pytestmark = pytest.mark.slow  # installs a package with Argos Translate and translates with it

# What Argos Translate searches with (argostranslate/translate.py): beam 4, at most 256 tokens,
# CTranslate2's length penalty 0.2 (log P / length^0.2), and attn's nearest (GNMT with 0.2).
# Argos searches as CTranslate2 does, with none of attn's rules: no_loops is left off to compare.
ARGOS_SEARCH = ["--beam", "4", "--length-penalty", "0.2", "--max-len-a", "0", "--max-len-b", "256", "--allow-loops"]
GREEDY = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "256", "--allow-loops"]

# Run in a process of its own: Argos reads its directories from the environment when imported,
# and creates them. Its greedy pass is what ARGOS_BEAM_SIZE=1 sets, without a second import.
ARGOS = """
import json, sys
from argostranslate import package, settings, translate

package.install_from_path(sys.argv[1])
(installed,) = package.get_installed_packages()
sentences = json.loads(sys.argv[2])
found = {"package": installed.package_path.name, "sentence_splitter": str(installed.packaged_sbd_path)}
found |= {key: getattr(installed, key) for key in ("from_code", "from_name", "to_code", "to_name")}
found["beam"] = [translate.translate(s, installed.from_code, installed.to_code) for s in sentences]
settings.beam_size = 1
found["greedy"] = [translate.translate(s, installed.from_code, installed.to_code) for s in sentences]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def translating_run(tmp_path_factory):
    """A tiny run trained long enough (300 steps, some 10 s) that its translations differ from
    input to input: the 40 steps of `trained_run` translate every sentence to an empty line, on
    which any package would agree with attn."""
    run = tmp_path_factory.mktemp("argos-run")
    result = train_tiny(run, "train.max_steps=300", "train.valid_every=300", "train.valid_bleu=false")
    assert result.exit_code == 0, result.output
    return run


def _argos_env(home) -> dict:
    """Argos's directories under `home`; no setting of the user's; any download would fail at once."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ARGOS_")}
    env |= {name: str(home / name.lower()) for name in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    env |= {"HOME": str(home), "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    env |= {"http_proxy": env["HTTP_PROXY"], "https_proxy": env["HTTPS_PROXY"], "NO_PROXY": "", "no_proxy": ""}
    return env


def test_argos_installs_the_package_and_translates_like_attn(translating_run, tmp_path):
    pytest.importorskip("argostranslate")
    runner = CliRunner()
    package_file = tmp_path / "en_zh.argosmodel"
    result = runner.invoke(
        app, ["export", "--run", str(translating_run), "--format", "argos", "--output", str(package_file)]
    )
    assert result.exit_code == 0, result.output
    assert "install_from_path" in result.stderr
    with zipfile.ZipFile(package_file) as archive:
        names = archive.namelist()
        readme = archive.read("translate-en_zh-1_0/README.md").decode("utf-8")
    assert {name.split("/")[0] for name in names} == {"translate-en_zh-1_0"}
    assert "CC-BY 2.0 FR" in readme and "tatoeba.org" in readme

    # Single sentences: Argos splits a line into sentences and translates each; attn takes the line whole.
    lines = (translating_run / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    sentences = list(dict.fromkeys(line for line in lines if not re.search(r"[.!?…]\s", line.strip())))[:30]
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-c", ARGOS, str(package_file), json.dumps(sentences)],
        capture_output=True,
        text=True,
        env=_argos_env(home),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    argos = json.loads(done.stdout.splitlines()[-1])
    assert (argos["from_code"], argos["from_name"], argos["to_code"], argos["to_name"]) == (
        "en",
        "English",
        "zh",
        "Chinese",
    )
    assert argos["sentence_splitter"].endswith("minisbd")  # the package's own: nothing downloaded

    installed = home / "xdg_data_home" / "argos-translate" / "packages" / argos["package"]
    for search, theirs in ((ARGOS_SEARCH, argos["beam"]), (GREEDY, argos["greedy"])):
        ours = runner.invoke(app, ["translate", "--model", str(installed / "model"), *search, *sentences])
        assert ours.exit_code == 0, ours.output
        assert ours.stdout.splitlines() == theirs, search
        assert len(set(theirs)) >= 10, "the translations must differ from sentence to sentence"


def test_the_sentence_splitter_ends_sentences_where_the_rule_says(tmp_path):
    minisbd = pytest.importorskip("minisbd")
    from attn_cli.export.sentence_splitter import minisbd_model

    model = tmp_path / "en.onnx"
    model.write_bytes(minisbd_model("en"))
    splitter = minisbd.SBDetect(str(model), use_gpu=False)
    assert splitter.sentences("It costs 3.5 dollars. Really?  Yes… 我爱你。你好吗？好") == [
        "It costs 3.5 dollars.",
        "Really?",
        "Yes…",
        "我爱你。",
        "你好吗？",
        "好",
    ]
    assert splitter.sentences("No end here") == ["No end here"]


@pytest.mark.parametrize(
    "code, argos, name",
    [
        ("en", "en", "English"),
        ("en-US", "en", "English"),
        ("zh", "zh", "Chinese"),
        ("zh_Hans", "zh", "Chinese"),
        ("zh-CN", "zh", "Chinese"),
        ("zh-Hant", "zt", "Chinese (traditional)"),
        ("zh-TW", "zt", "Chinese (traditional)"),
        ("pt-BR", "pb", "Portuguese (Brazil)"),
        ("xx", "xx", "xx"),
    ],
)
def test_argos_codes_and_names(code, argos, name):
    assert (argos_code(code), language_name(code)) == (argos, name)


def test_refusals_are_one_line(tmp_path):
    from attn_cli.checkpoint import save_checkpoint
    from attn_cli.config import Config, ModelConfig, TokenizerConfig
    from attn_cli.data.tokenizer import train_tokenizers
    from attn_cli.model import build_model

    cfg, tokenizers, model = checkpoint_parts()
    joint = tmp_path / "joint.pt"
    save_checkpoint(joint, cfg, tokenizers, model, step=1, epoch=1)
    separate_cfg = Config(
        data=cfg.data,
        tokenizer=TokenizerConfig(vocab_size=300, character_coverage=1.0, joint=False),
        model=ModelConfig(**{**vars(cfg.model), "share_embeddings": False}),
    )
    separate_tokenizers = train_tokenizers(
        [f"sentence number {i}" for i in range(200)],
        [f"句子{i}号，{chr(0x4E00 + i % 20)}。" for i in range(200)],  # enough characters for 300 pieces
        separate_cfg.tokenizer,
    )
    separate = tmp_path / "separate.pt"
    sizes = (separate_tokenizers.source.vocab_size, separate_tokenizers.target.vocab_size)
    save_checkpoint(separate, separate_cfg, separate_tokenizers, build_model(separate_cfg.model, *sizes), 1, 1)
    taken = tmp_path / "taken.argosmodel"
    taken.write_text("mine\n")
    cases = [
        (separate, tmp_path / "a.argosmodel", "tokenizer.joint=false"),
        (joint, tmp_path / "exported", "is not an .argosmodel file"),
        (joint, taken, "already exists"),
    ]
    for checkpoint, output, expected in cases:
        args = ["export", "--checkpoint", str(checkpoint), "--format", "argos", "--output", str(output)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and expected in result.stderr, result.output
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output, result.output
    assert taken.read_text() == "mine\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["joint.pt", "separate.pt", "taken.argosmodel"]
