"""A model too large for the machine is refused in one line that gives its parameter count."""

import dataclasses

import pytest
import torch
from support.runs import numbered_tokenizers

from attn_cli import device as allocation
from attn_cli.config import Config, CorpusConfig, DataConfig, ModelConfig
from attn_cli.device import ModelSizeError, allocate_model
from attn_cli.model import build_model

SMALL = ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=2)


def test_the_model_built_is_the_one_the_config_describes():
    torch.manual_seed(0)
    allocated = allocate_model(SMALL, 300, 300, torch.device("cpu"), training=True, fix="")
    torch.manual_seed(0)
    expected = build_model(SMALL, 300, 300)
    assert allocated.state_dict().keys() == expected.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(allocated.state_dict().values(), expected.state_dict().values()))


def test_a_model_larger_than_memory_is_refused_with_its_parameter_count(monkeypatch):
    huge = dataclasses.replace(SMALL, d_model=65536, ffn_dim=262144)
    with torch.device("meta"):
        parameters = sum(p.numel() for p in build_model(huge, 8000, 8000).parameters())
    monkeypatch.setattr(allocation, "build_model", _never_on_a_real_device(allocation.build_model))
    with pytest.raises(ModelSizeError) as error:
        allocate_model(huge, 8000, 8000, torch.device("cpu"), training=True, fix="lower model.d_model")
    message = str(error.value)
    assert f"a model of {parameters:,} parameters needs " in message and "\n" not in message
    assert "for its weights, gradients and AdamW moments" in message and message.endswith("; lower model.d_model")


def test_an_allocation_that_fails_anyway_is_one_line(monkeypatch):
    def out_of_memory(cfg, src_vocab_size, tgt_vocab_size):
        if torch.empty(0).device.type == "meta":
            return build_model(cfg, src_vocab_size, tgt_vocab_size)
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:116] data. DefaultCPUAllocator: not enough memory: "
            "you tried to allocate 1099511627776 bytes.\nmore lines of C++ frames"
        )

    monkeypatch.setattr(allocation, "build_model", out_of_memory)
    with pytest.raises(
        ModelSizeError,
        match=r"and allocating it failed \(\[enforce fail .* 1099511627776 bytes\.\); "
        r"lower it$",
    ):
        allocate_model(SMALL, 300, 300, torch.device("cpu"), training=False, fix="lower it")


def test_a_checkpoint_that_describes_a_model_too_large_is_refused_in_one_line(tmp_path):
    from attn_cli.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    cfg = Config(data=DataConfig(corpus=CorpusConfig(path="corpus.tsv")), model=SMALL)
    tokenizers = numbered_tokenizers()
    path = tmp_path / "forged.pt"
    save_checkpoint(path, cfg, tokenizers, build_model(SMALL, 300, 300), step=1, epoch=1)
    payload = torch.load(path, weights_only=True)
    payload["config"]["model"]["d_model"] = payload["config"]["model"]["ffn_dim"] = 2**20
    torch.save(payload, path)
    with pytest.raises((ModelSizeError, CheckpointError)) as error:
        load_checkpoint(path)
    assert str(error.value).endswith(f"{path} is not a model this machine can load") and "\n" not in str(error.value)


def _never_on_a_real_device(build):
    def checked(cfg, src_vocab_size, tgt_vocab_size):
        assert torch.empty(0).device.type == "meta", "a model larger than memory must not be allocated"
        return build(cfg, src_vocab_size, tgt_vocab_size)

    return checked
