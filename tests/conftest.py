"""The tests' fixtures. What the tests share besides fixtures is in the `support` package
(tests/support/): small models, runs and checkpoints, engines, reference searches, serving helpers."""

import pytest
import torch
from support.runs import save_random_checkpoint, train_tiny


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="where the searches' equivalence tests run (the `device` fixture): cpu (default) or cuda; "
        "bench/gpu_checks.py runs them with --device cuda",
    )


def pytest_configure(config):
    device = config.getoption("--device")
    if device not in ("cpu", "cuda"):
        raise pytest.UsageError(f"--device {device}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(
            f"--device cuda: torch {torch.__version__} sees no CUDA device here; leave --device out"
        )


@pytest.fixture
def device(request) -> torch.device:
    """The device of `pytest --device` (cpu by default): the searches' equivalences (cached =
    uncached, beam 1 = greedy, batched = reference) hold on every device attn decodes on."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture(autouse=True)
def _seeded_and_threads_restored():
    """Each test starts from seed 0, and leaves torch's thread count as it found it: a training
    run in the test's process sets it (train.threads), and a later test that compares this thread's
    decoding with a server's worker thread, which keeps the default, would see other roundings."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tensors this small run faster without a pool of threads,
    much faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """One tiny training run (configs/tiny.yaml, some 20 s) shared by every test file that needs one.
    A test that changes the run directory copies it first: `shutil.copytree(trained_run, tmp_path / "run")`."""
    run_dir = tmp_path_factory.mktemp("run")
    result = train_tiny(run_dir, "train.keep_last=1")
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture(scope="session")
def served_checkpoint(tmp_path_factory):
    """save_random_checkpoint's checkpoint, shared by the attn serve tests (none of them writes to it)."""
    return save_random_checkpoint(tmp_path_factory.mktemp("served") / "model.pt")
