"""Training on two processes (gloo on the CPU) gives the update of one process over the same global
batches, keeps the processes' weights identical, and stops and resumes as exactly as one process.

One spawn of two processes runs every two-process scenario (starting processes is the slow part);
the tests then compare what they left behind with single-process runs made here.
"""

import os
import signal
import socket

import pytest
import torch
import torch.multiprocessing as mp
from support.models import parameters_of, small_model
from support.runs import REPO, tiny_config

from attn_cli.data.batching import Example
from attn_cli.data.collate import collate
from attn_cli.training.distributed import SINGLE_PROCESS, Ranks, process_group, torchrun_environment
from attn_cli.training.guards import TrainingInterrupted
from attn_cli.training.precision import resolve_precision
from attn_cli.training.progress import TrainingDisplay
from attn_cli.training.setup import setup_training
from attn_cli.training.step import TrainingObjective, TrainingStep
from attn_cli.training.trainer import Trainer

pytestmark = pytest.mark.slow  # spawns training processes

WORLD_SIZE = 2
CPU = torch.device("cpu")

# Small batches (1 to 3 examples), so shares differ in token count and some processes get none;
# two batches per update, so DDP's no_sync path runs; no dropout, so one process can be compared.
EQUIVALENCE = [
    "train.max_tokens=40",
    "train.accumulate=2",
    "train.max_steps=4",
    "train.valid_every=100",
    "train.valid_bleu=false",
    "train.threads=1",
    "train.device=cpu",
    "model.dropout=0.0",
]
# Dropout on: resuming must also continue each process's own random streams.
RESUME = [
    "train.max_tokens=256",
    "train.valid_every=4",
    "train.valid_bleu=false",
    "train.threads=1",
    "train.device=cpu",
    "model.dropout=0.1",
]


def run_trainer(cfg, ranks=SINGLE_PROCESS, resume=False):
    trainer = Trainer(setup_training(cfg, TrainingDisplay(quiet=True), resume=resume, ranks=ranks))
    trainer.run()
    return trainer


def step_examples():
    """Six examples of different lengths: uneven token counts between the processes' shares."""
    generator = torch.Generator().manual_seed(5)
    return [
        Example(
            i,
            torch.randint(4, 50, (2 + i,), generator=generator).tolist(),
            torch.randint(4, 50, (7 - i,), generator=generator).tolist(),
        )
        for i in range(6)
    ]


def sgd_step(ranks, batches_of_positions):
    """One plain-SGD update (lr 1, no clipping) of a fixed model: the parameters move by exactly
    minus the gradient, so a wrongly scaled loss shows (Adam would hide a constant factor)."""
    torch.manual_seed(0)
    model = small_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    precision = resolve_precision("fp32", CPU)
    replica = ranks.replicate(TrainingObjective(model, 0.1))
    update = TrainingStep(
        model,
        replica,
        optimizer,
        scheduler,
        precision.grad_scaler(CPU),
        precision,
        CPU,
        clip_norm=0.0,
        ranks=ranks,
        replica=replica,
    )
    examples = step_examples()
    result = update([collate([examples[p] for p in ranks.share(positions)]) for positions in batches_of_positions])
    return parameters_of(model), result.loss


STEP_BATCHES = [[0, 1, 2], [3, 4, 5]]


def _worker(rank, port, out):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank)
    )
    os.chdir(REPO)  # configs/tiny.yaml: the repository's copy of the built-in config
    torch.set_num_threads(1)
    with process_group("cpu") as ranks:
        parameters, loss = sgd_step(ranks, STEP_BATCHES)
        torch.save({"parameters": parameters, "loss": loss}, out / f"sgd-rank{rank}.pt")

        trainer = run_trainer(tiny_config(*EQUIVALENCE, run_dir=out / "equivalence"), ranks)
        torch.save(parameters_of(trainer.setup.model), out / f"equivalence-rank{rank}.pt")

        run_trainer(tiny_config(*RESUME, "train.max_steps=8", run_dir=out / "straight"), ranks)

        real_step = Trainer.train_step

        def terminated_during_step_3(self, batches):
            if self.state.step == 2 and rank == 1:  # a signal to one process only must stop both
                os.kill(os.getpid(), signal.SIGTERM)
            return real_step(self, batches)

        Trainer.train_step = terminated_during_step_3
        try:
            run_trainer(tiny_config(*RESUME, "train.max_steps=8", run_dir=out / "resumed"), ranks)
            raise AssertionError("the run should have stopped on SIGTERM")
        except TrainingInterrupted:
            pass
        finally:
            Trainer.train_step = real_step
        torch.save(
            {"stopped_at": torch.load(out / "resumed" / "checkpoints" / "last.pt", weights_only=False)["step"]}
            if rank == 0
            else {},
            out / f"stopped-rank{rank}.pt",
        )
        ranks.gather(None)  # rank 0 has written last.pt before anyone resumes from it
        run_trainer(tiny_config(*RESUME, "train.max_steps=8", run_dir=out / "resumed"), ranks, resume=True)

        # A validation loss that never improves: rank 0 alone decides to stop early, at step 4.
        real_loss = Trainer.validation_loss
        Trainer.validation_loss = lambda self: 1.0
        try:
            trainer = run_trainer(
                tiny_config(
                    *RESUME,
                    "train.max_steps=20",
                    "train.valid_every=2",
                    "train.early_stopping={metric: loss, patience: 1}",
                    run_dir=out / "early",
                ),
                ranks,
            )
        finally:
            Trainer.validation_loss = real_loss
        torch.save({"step": trainer.state.step}, out / f"early-rank{rank}.pt")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    for attempt in range(3):
        out = tmp_path_factory.mktemp("ddp")
        try:
            mp.spawn(_worker, args=(free_port(), out), nprocs=WORLD_SIZE, join=True)
            break
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            # Another program may take the free port between the probe and rank 0's bind, or the
            # shared machine may stall a rendezvous: try again on a fresh port and directory. A
            # real failure fails every time.
            if attempt == 2:
                raise
    return out


def test_the_update_of_two_processes_is_that_of_one_over_the_whole_batch(two_process_runs):
    expected_parameters, expected_loss = sgd_step(SINGLE_PROCESS, STEP_BATCHES)
    for rank in range(WORLD_SIZE):
        saved = torch.load(two_process_runs / f"sgd-rank{rank}.pt")
        assert saved["loss"] == pytest.approx(expected_loss, rel=1e-6)
        for name, tensor in expected_parameters.items():
            torch.testing.assert_close(saved["parameters"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_two_processes_train_identical_weights_equal_to_one_process(
    two_process_runs, tmp_path, monkeypatch, one_thread
):
    rank0 = torch.load(two_process_runs / "equivalence-rank0.pt")
    rank1 = torch.load(two_process_runs / "equivalence-rank1.pt")
    assert all(torch.equal(rank0[name], rank1[name]) for name in rank0), "the processes' weights diverged"

    monkeypatch.chdir(REPO)
    single = run_trainer(tiny_config(*EQUIVALENCE, run_dir=tmp_path / "single"))
    assert single.state.step == 4
    for name, tensor in parameters_of(single.setup.model).items():
        torch.testing.assert_close(
            without_key_bias(name, rank0[name]), without_key_bias(name, tensor), rtol=1e-5, atol=1e-6, msg=name
        )


def without_key_bias(name, tensor):
    """The parameter without its attention key bias. Adding a bias to every key adds one constant to
    all of a query's scores, which softmax ignores: that gradient is zero but for rounding, and Adam's
    first steps, which move by about lr x sign(gradient), turn the rounding noise into differences of
    up to lr. Every other parameter agrees to within 1e-7 after four steps."""
    if name.endswith("qkv_proj.bias"):  # query, key, value
        d_model = tensor.shape[0] // 3
        return torch.cat([tensor[:d_model], tensor[2 * d_model :]])
    if name.endswith("kv_proj.bias"):  # key, value
        return tensor[tensor.shape[0] // 2 :]
    return tensor


def test_a_signal_to_one_process_stops_both_and_the_resumed_run_is_exact(two_process_runs):
    assert torch.load(two_process_runs / "stopped-rank0.pt")["stopped_at"] == 3
    straight = torch.load(two_process_runs / "straight" / "checkpoints" / "last.pt", weights_only=False)
    resumed = torch.load(two_process_runs / "resumed" / "checkpoints" / "last.pt", weights_only=False)
    assert straight["step"] == resumed["step"] == 8
    assert all(torch.equal(straight["model"][name], resumed["model"][name]) for name in straight["model"])
    rng = straight["training_state"]["rng_by_rank"]
    assert len(rng) == WORLD_SIZE and not torch.equal(rng[0]["torch"], rng[1]["torch"]), (
        "each process keeps its own dropout stream"
    )


def test_early_stopping_decided_on_rank_0_stops_both_processes_at_the_same_step(two_process_runs):
    assert [torch.load(two_process_runs / f"early-rank{rank}.pt")["step"] for rank in range(WORLD_SIZE)] == [4, 4]
    assert torch.load(two_process_runs / "early" / "checkpoints" / "last.pt", weights_only=False)["step"] == 4


def test_torchrun_environment_is_read_only_for_more_than_one_process():
    assert torchrun_environment({}) is None
    assert torchrun_environment({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}) is None
    assert torchrun_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1)
    assert Ranks(rank=1, world_size=3).share([10, 11, 12, 13, 14]) == [11, 14]
    assert Ranks(rank=2, world_size=3).share([10, 11]) == []


def test_each_process_reads_only_its_own_sentences_of_each_batch(tmp_path):
    """Each process takes its share of a batch from the memory-mapped pairs, and the two shares are
    disjoint and whole; counting the update's tokens reads no pair's ids at all."""
    from types import SimpleNamespace

    from attn_cli.data.batching import token_batches
    from attn_cli.data.prepared import TokenizedPairs, TokenizedPairsWriter

    rows = [list(range(1, 2 + i % 9)) for i in range(60)]
    writer = TokenizedPairsWriter(tmp_path)
    writer.add(rows, [row + [7] for row in rows])

    class Recorded(TokenizedPairs):
        read: list[int] = []

        def __getitem__(self, i):
            self.read.append(int(i))
            return super().__getitem__(i)

    pairs = writer.finish()
    recorded = Recorded(pairs.src_ids, pairs.src_offsets, pairs.tgt_ids, pairs.tgt_offsets)
    batches = [b.tolist() for b in token_batches(pairs, 60, shuffle=True, seed=1) if len(b) >= WORLD_SIZE]
    assert batches, "batches of several sentences"
    for positions in batches:
        shares = []
        for rank in range(WORLD_SIZE):
            Recorded.read = []
            setup = SimpleNamespace(ranks=Ranks(rank=rank, world_size=WORLD_SIZE), device=CPU)
            trainer = SimpleNamespace(setup=setup, _epoch_examples=recorded)
            batch = Trainer._local_batch(trainer, positions)
            assert batch.indices == Recorded.read  # what the batch holds is what was read
            shares.append(set(Recorded.read))
        assert not shares[0] & shares[1] and shares[0] | shares[1] == set(positions)
        Recorded.read = []
        trainer = SimpleNamespace(_epoch_examples=recorded)
        expected = sum(len(rows[p]) * 2 + 1 + 2 for p in positions)
        assert Trainer._tokens_of(trainer, [positions]) == expected and Recorded.read == []
