"""`attn doctor` passes a healthy run and catches each planted fault by the check's name: a decoder
that sees the future, padding that is attended to, positions that are missing, scores that are not
scaled, heads too small, a batch too large for the memory given, and a corpus with bad pairs."""

import json
import types

import pytest
import torch
import torch.nn.functional as F
from support.runs import REPO, tiny_config
from typer.testing import CliRunner

import attn_cli.model.attention as attention_module
import attn_cli.model.transformer as transformer_module
from attn_cli.cli.app import app
from attn_cli.doctor.diagnose import diagnose_checkpoint, diagnose_config

TINY = str(REPO / "configs" / "tiny.yaml")
# What a healthy tiny run warns about, and why (docs/doctor.md): tiny.yaml's 4 heads of d_model 32
# are 8 wide; its 1,000 pieces are many for the 1,200 pairs it trains on; and after 40 steps its
# attention has not yet learned where to look.
TINY_WARNINGS = {"head size", "vocabulary size", "attention entropy"}


def doctor(*args):
    return CliRunner().invoke(app, ["doctor", *args])


def statuses(checks) -> dict[str, str]:
    return {check.name: check.status for check in checks}


def test_a_healthy_tiny_run_passes_every_check(trained_run):
    result = doctor("--run", str(trained_run), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    found = {check["name"]: check["status"] for check in report["checks"]}
    assert {check["section"] for check in report["checks"]} == {"environment", "config", "memory", "data", "model"}
    assert {
        "causal mask",
        "padding masks",
        "cached decoding",
        "cross-attention input",
        "positions",
        "score scale",
        "attention entropy",
        "training step",
        "head size",
        "malformed lines",
    } <= set(found)
    assert {name for name, status in found.items() if status != "pass"} <= TINY_WARNINGS, found
    assert "fail" not in found.values() and not report["failed"]


def test_the_table_names_each_check_and_its_verdict(trained_run):
    result = doctor("--run", str(trained_run))
    assert result.exit_code == 0, result.output
    for words in ("causal mask", "score scale", "training step", "pass"):
        assert words in result.stdout
    assert "checks:" in result.stdout.splitlines()[-1]


def _no_causal_mask(monkeypatch):
    monkeypatch.setattr(
        transformer_module,
        "causal_mask",
        lambda length, device: torch.ones(1, 1, length, length, dtype=torch.bool, device=device),
    )


def _no_padding_masks(monkeypatch):
    monkeypatch.setattr(
        transformer_module,
        "key_padding_mask",
        lambda ids, pad_id: torch.ones_like(ids, dtype=torch.bool)[:, None, None, :],
    )


def _no_positions(monkeypatch):
    monkeypatch.setattr(
        transformer_module.SinusoidalPositions, "forward", lambda self, start, length: torch.zeros(length, self.d_model)
    )


def _no_scaling(monkeypatch):
    """Both attention paths without 1/sqrt(d_head): the explicit formula's sqrt, and the fused kernel's scale."""
    monkeypatch.setattr(attention_module, "math", types.SimpleNamespace(sqrt=lambda x: 1.0))
    unscaled = types.SimpleNamespace(**{name: getattr(F, name) for name in dir(F) if not name.startswith("__")})
    unscaled.scaled_dot_product_attention = lambda q, k, v, attn_mask=None, dropout_p=0.0: (
        F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=1.0)
    )
    monkeypatch.setattr(attention_module, "F", unscaled)


@pytest.mark.parametrize(
    "plant, check",
    [
        (_no_causal_mask, "causal mask"),
        (_no_padding_masks, "padding masks"),
        (_no_positions, "positions"),
        (_no_scaling, "score scale"),
    ],
    ids=["causal-mask", "padding-masks", "positions", "scaling"],
)
def test_a_planted_fault_fails_its_check(trained_run, monkeypatch, plant, check):
    # Without the fault the check passes: test_a_healthy_tiny_run_passes_every_check.
    plant(monkeypatch)
    checks = diagnose_checkpoint(trained_run, None)
    assert statuses(checks)[check] == "fail", [c for c in checks if c.name == check]


def test_missing_scaling_is_named_as_such(trained_run, monkeypatch):
    _no_scaling(monkeypatch)
    (scale,) = [check for check in diagnose_checkpoint(trained_run, None) if check.name == "score scale"]
    assert "scaling is missing" in scale.found
    assert all(abs(ratio - 8**0.5) < 1e-3 for ratio in scale.numbers["ratios"].values())  # d_head 8


def test_heads_of_eight_dimensions_warn_and_of_thirty_two_pass(tmp_path):
    run_dir = f"run_dir={tmp_path / 'run'}"
    assert statuses(diagnose_config(TINY, [run_dir]))["head size"] == "warn"  # 32 / 4 heads
    assert statuses(diagnose_config(TINY, [run_dir, "model.num_heads=1"]))["head size"] == "pass"


def test_heads_that_do_not_divide_d_model_fail_the_config(tmp_path):
    result = doctor("--config", TINY, "--set", "model.num_heads=3", "--json")
    assert result.exit_code == 1, result.output
    (check,) = json.loads(result.stdout)["checks"]
    assert (check["name"], check["status"]) == ("heads divide d_model", "fail")


def test_a_step_that_cannot_fit_the_memory_given_fails_with_the_advice(tmp_path):
    args = ["--config", TINY, "--set", f"run_dir={tmp_path / 'run'}", "--json"]
    small = doctor(*args, "--memory-gb", "0.001")
    assert small.exit_code == 1, small.output
    (step,) = [c for c in json.loads(small.stdout)["checks"] if c["name"] == "training step"]
    assert step["status"] == "fail"
    assert "train.gradient_checkpointing: true" in step["fix"] and "train.max_tokens" in step["fix"]

    roomy = doctor(*args, "--memory-gb", "100")
    assert roomy.exit_code == 0, roomy.output  # a warning (the head size) leaves the status 0
    checks = {c["name"]: c for c in json.loads(roomy.stdout)["checks"]}
    assert checks["training step"]["status"] == "pass" and checks["head size"]["status"] == "warn"

    # Above 70% of the memory it warns.
    needed = checks["training step"]["numbers"]["estimate_bytes"]
    (tight,) = [
        c
        for c in diagnose_config(TINY, [f"run_dir={tmp_path / 'run'}"], memory_gb=needed / 0.8 / 2**30)
        if c.name == "training step"
    ]
    assert tight.status == "warn"


def test_the_estimate_shrinks_with_each_piece_of_advice():
    from attn_cli.training.memory import estimate_step_memory

    def total(*overrides):
        cfg = tiny_config(
            "data.max_source_tokens=256", "data.max_target_tokens=256", "train.max_tokens=8192", *overrides
        )
        return estimate_step_memory(cfg, 1000, 1000, cfg.train.precision, "cpu").total

    plain = total()
    assert total("train.gradient_checkpointing=true") < plain
    assert total("train.max_tokens=2048") < plain
    assert total("train.precision=bf16") < plain
    assert total("model.activation=silu") > plain, "SiLU's backward keeps its input as well as its output"


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_bad_pairs_are_counted_with_their_lines(tmp_path):
    good = [f"Sentence number {i} is here.\t第{i}句话在这里。" for i in range(40)]
    corpus = _write(
        tmp_path / "train.tsv",
        good[:5]
        + [
            "only one field",  # line 6: malformed
            "No target.\t",  # line 7: empty side
            "Tom.\tTom.",  # line 8: a copy
            "This long sentence has nothing whatever to do with its so-called translation.\t是。",  # line 9: ratio
            "Shared source.\t共同的。",  # line 10: also in the validation corpus
        ]
        + good[5:],
    )
    valid = _write(tmp_path / "valid.tsv", ["Shared source.\t共同的。", "Another one.\t另一个。"])
    test = _write(tmp_path / "test.tsv", ["Another one.\t另一个。", "A third.\t第三个。"])
    config = tmp_path / "c.yaml"
    config.write_text(
        f"run_dir: {tmp_path / 'run'}\ndata:\n  corpus: {{path: {corpus}}}\n"
        f"  valid_corpus: {{path: {valid}}}\n  test_corpus: {{path: {test}}}\n  src_lang: en\n  tgt_lang: zh\n",
        encoding="utf-8",
    )
    checks = {check.name: check for check in diagnose_config(config)}
    assert checks["malformed lines"].status == "warn" and f"{corpus}:6" in checks["malformed lines"].found
    assert checks["empty sides"].status == "warn" and f"{corpus}:7" in checks["empty sides"].found
    assert checks["copies"].status == "warn" and "line 8" in checks["copies"].found
    assert checks["length ratios"].status == "warn" and "line 9" in checks["length ratios"].found
    overlap = checks["sources in two splits"]
    assert overlap.status == "fail" and "line 10" in overlap.found
    assert overlap.numbers == {"valid": 1, "test": 0, "valid and test": 1}
    assert checks["vocabulary size"].status == "skip"  # no tokenizer yet

    clean = _write(tmp_path / "clean.tsv", good)
    config.write_text(
        f"run_dir: {tmp_path / 'run'}\ndata:\n  corpus: {{path: {clean}}}\n"
        f"  valid_corpus: {{path: {test}}}\n  test_corpus: {{path: {test}}}\n  src_lang: en\n  tgt_lang: zh\n",
        encoding="utf-8",
    )
    clean_checks = statuses(diagnose_config(config))
    assert all(clean_checks[name] == "pass" for name in ("malformed lines", "empty sides", "copies", "length ratios"))
    assert clean_checks["sources in two splits"] == "fail"  # the validation and test corpora are one file


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative", "rotary"])
def test_every_position_scheme_passes_the_model_checks(positions, monkeypatch):
    """The score scale is recomputed with the layer's own relative bias or rotation, so a healthy
    model of any scheme passes; and with the scheme's positions taken out, the positions check fails."""
    from support.models import random_source, small_model

    from attn_cli.doctor.model_checks import model_checks
    from attn_cli.doctor.probes import Probe

    torch.manual_seed(0)
    model = small_model(positions=positions)
    src = random_source(4, 9, lengths=[9, 5, 7, 8])
    tgt_in = torch.cat([torch.full((4, 1), 1), torch.randint(4, 50, (4, 7))], dim=1)
    probe = Probe(src, tgt_in, "random")
    checks = {check.name: check for check in model_checks(model, probe)}
    failed = {name: check.found for name, check in checks.items() if check.status == "fail"}
    assert not failed and checks["score scale"].status == "pass", failed

    from attn_cli.model import positions as positions_module

    without = {
        "sinusoidal": ("SinusoidalPositions", lambda self, start, length: torch.zeros(length, self.d_model)),
        "learned": ("LearnedPositions", lambda self, start, length: torch.zeros(length, 32)),
        "relative": ("RelativePositionBias", lambda self, start, queries, keys: torch.zeros(1, 4, queries, keys)),
        "rotary": ("RotaryPositions", None),
    }[positions]
    if positions == "rotary":
        monkeypatch.setattr(positions_module.RotaryPositions, "rotate", lambda self, x, start: x)
    else:
        monkeypatch.setattr(getattr(positions_module, without[0]), "forward", without[1])
    checks = {check.name: check for check in model_checks(model, probe)}
    assert checks["positions"].status == "fail", checks["positions"].found
