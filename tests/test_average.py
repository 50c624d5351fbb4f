"""Averaging checkpoints gives the elementwise mean of their weights."""

import torch
from support.models import small_model
from support.runs import checkpoint_parts

from attn_cli.checkpoint import average_checkpoints, average_state_dicts, load_checkpoint, save_checkpoint
from attn_cli.data.lengths import LengthModel
from attn_cli.paths import RunPaths


def test_floating_entries_are_averaged_and_integer_buffers_come_from_the_newest():
    older = {
        "weight": torch.tensor([1.0, 2.0]),
        "half": torch.tensor([1.0], dtype=torch.bfloat16),
        "count": torch.tensor(3),
    }
    newer = {
        "weight": torch.tensor([3.0, 6.0]),
        "half": torch.tensor([2.0], dtype=torch.bfloat16),
        "count": torch.tensor(7),
    }
    averaged = average_state_dicts([older, newer])
    assert torch.equal(averaged["weight"], torch.tensor([2.0, 4.0]))
    assert averaged["half"].dtype == torch.bfloat16 and averaged["half"].item() == 1.5
    assert averaged["count"].item() == 7


def test_the_average_of_two_checkpoints_is_their_elementwise_mean(tmp_path):
    cfg, tokenizers, _ = checkpoint_parts()
    vocab = tokenizers.source.vocab_size
    paths = RunPaths.of(tmp_path)
    models = []
    lengths = LengthModel.fit([1, 2, 2, 5], [2, 3, 2, 6])
    for step in (100, 200):
        torch.manual_seed(step)  # different weights in each
        model = small_model(src_vocab_size=vocab, tgt_vocab_size=vocab, encoder_layers=1, decoder_layers=1)
        save_checkpoint(paths.step_checkpoint(step), cfg, tokenizers, model, step=step, epoch=1, lengths=lengths)
        models.append(model.state_dict())

    output = paths.average_checkpoint(2)
    average_checkpoints(paths.step_checkpoints(), output)
    averaged = load_checkpoint(output)
    for name, tensor in averaged.model.state_dict().items():
        torch.testing.assert_close(tensor, (models[0][name] + models[1][name]) / 2, rtol=0, atol=1e-7, msg=name)
    assert not torch.equal(models[0]["tgt_embedding.weight"], models[1]["tgt_embedding.weight"])
    assert (averaged.step, averaged.metrics) == (200, {"averaged_steps": [100, 200]})
    assert averaged.lengths.counts.tolist() == lengths.counts.tolist(), "the training pairs' lengths are kept"
