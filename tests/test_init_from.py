"""train.init_from: a new run that starts from another run's weights and tokenizer, and from nothing else."""

import pytest
import torch
from support.runs import tiny_config

from attn_cli.checkpoint import load_checkpoint
from attn_cli.config import ConfigError
from attn_cli.data.batching import token_batches
from attn_cli.data.collate import collate
from attn_cli.training.progress import TrainingDisplay
from attn_cli.training.setup import setup_training


def test_a_fine_tuned_run_starts_from_exactly_the_checkpoint_with_a_new_optimizer(trained_run, tmp_path):
    base = load_checkpoint(trained_run / "checkpoints" / "best.pt")
    # Another slice of the corpus and another seed: the data is the new run's own.
    cfg = tiny_config(
        f"train.init_from={trained_run}",
        "data.max_pairs=400",
        "data.split_seed=5",
        "train.seed=9",
        "tokenizer.vocab_size=1000",
        run_dir=tmp_path / "fine",
    )
    setup = setup_training(cfg, TrainingDisplay(quiet=True))
    assert setup.tokenizers.source.model_proto == base.tokenizers.source.model_proto, "the tokenizer is not retrained"
    saved = (tmp_path / "fine" / "tokenizer" / "joint.model").read_bytes()
    assert saved == base.tokenizers.source.model_proto
    batch = collate([setup.train_examples[p] for p in token_batches(setup.train_examples, 400, shuffle=False)[0]])
    setup.model.eval()
    with torch.no_grad():  # step 0: the same function as the checkpoint's model
        assert torch.equal(setup.model(batch.src, batch.tgt_in), base.model(batch.src, batch.tgt_in))
    assert setup.optimizer.state_dict()["state"] == {}, "a new optimizer: no moments carried over"
    assert setup.scheduler.last_epoch == 0 and setup.state.step == 0
    assert setup.scheduler.get_last_lr()[0] < cfg.train.lr, "its own warmup starts again from a small rate"


@pytest.mark.parametrize(
    "setting, key", [("model.d_model=64", "model.d_model"), ("tokenizer.vocab_size=2000", "tokenizer.vocab_size")]
)
def test_a_model_or_tokenizer_setting_that_differs_is_refused_by_its_key(trained_run, tmp_path, setting, key):
    cfg = tiny_config(f"train.init_from={trained_run}", setting, run_dir=tmp_path / "fine")
    with pytest.raises(ConfigError) as refused:
        setup_training(cfg, TrainingDisplay(quiet=True))
    assert refused.value.key == key and "train.init_from" in str(refused.value)
    assert not (tmp_path / "fine" / "tokenizer").exists(), "nothing written for a refused start"


def test_a_missing_starting_point_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist") as refused:
        cfg = tiny_config(f"train.init_from={tmp_path / 'nowhere'}", run_dir=tmp_path / "fine")
        setup_training(cfg, TrainingDisplay(quiet=True))
    assert refused.value.key == "train.init_from"
