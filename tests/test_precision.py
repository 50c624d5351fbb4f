"""`train.precision` maps to one autocast context and a scaler enabled for fp16 only; auto picks
by what the device runs fast."""

import pytest
import torch

from attn_cli.training import precision as precision_module
from attn_cli.training.precision import cpu_bf16_flags, resolve_precision, slow_here

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "name, dtype, scaled",
    [("fp32", torch.float32, False), ("bf16", torch.bfloat16, False), ("fp16", torch.float16, True)],
)
def test_each_precision_is_one_autocast_dtype_and_only_fp16_scales(name, dtype, scaled):
    chosen = resolve_precision(name, CPU)
    layer = torch.nn.Linear(4, 4)
    with chosen.autocast(CPU):
        assert layer(torch.randn(2, 4)).dtype == dtype
    assert chosen.grad_scaler(CPU).is_enabled() is scaled


def test_auto_on_a_cpu_picks_bf16_only_with_native_bf16(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_bf16_flags", lambda: ["amx_bf16"])
    with_amx = resolve_precision("auto", CPU)
    assert with_amx.name == "bf16" and "amx_bf16" in with_amx.describe()
    monkeypatch.setattr(precision_module, "cpu_bf16_flags", lambda: [])
    assert resolve_precision("auto", CPU).name == "fp32"


def test_auto_never_picks_what_the_device_would_emulate(monkeypatch):
    for flags in ([], ["avx512_bf16"]):
        monkeypatch.setattr(precision_module, "cpu_bf16_flags", lambda flags=flags: flags)
        assert not slow_here(resolve_precision("auto", CPU).name, CPU)
        assert bool(slow_here("bf16", CPU)) is not bool(flags)
        assert slow_here("fp16", CPU) and not slow_here("fp32", CPU)
    for capability in ((7, 5), (8, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        cuda = torch.device("cuda")
        assert not slow_here(resolve_precision("auto", cuda).name, cuda)
        assert bool(slow_here("bf16", cuda)) is (capability < (8, 0)) and not slow_here("fp16", cuda)


@pytest.mark.slow  # a training run
def test_training_in_an_emulated_precision_says_so_and_what_to_set(monkeypatch, tmp_path):
    from support.runs import train_tiny

    monkeypatch.setattr(precision_module, "cpu_bf16_flags", lambda: [])
    result = train_tiny(tmp_path / "run", "train.precision=bf16", "train.max_steps=1", "train.valid_bleu=false")
    assert result.exit_code == 0, result.output
    assert "warning: train.precision bf16 runs many times slower" in result.output
    assert "set train.precision: auto (fp32)" in result.output
    quiet = train_tiny(tmp_path / "fp32", "train.max_steps=1", "train.valid_bleu=false")
    assert "warning: train.precision" not in quiet.output


@pytest.mark.parametrize("capability, expected", [((8, 0), "bf16"), ((9, 0), "bf16"), ((7, 5), "fp16")])
def test_auto_on_cuda_picks_bf16_from_ampere_on_and_fp16_before(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_precision("auto", torch.device("cuda")).name == expected


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\n")
    assert cpu_bf16_flags(cpuinfo) == ["avx512_bf16"]
    cpuinfo.write_text("flags\t\t: fpu sse avx2\n")
    assert cpu_bf16_flags(cpuinfo) == []
    assert cpu_bf16_flags(tmp_path / "missing") == []
