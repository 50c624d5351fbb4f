"""Chaos trials: kill -9 a tiny training run at random moments, resume it, and check that nothing was lost.

tests/test_chaos.py runs each part as a test (a few trials; ATTN_CHAOS_TRIALS=20 for more); a longer
campaign with a table and JSON runs from the repository root as `python3 tests/support/chaos.py`.

Each trial trains the built-in tiny config into a fresh run directory and kills it with SIGKILL at a
random moment: at a time drawn uniformly from the start of an unbroken reference run (setup
included) to the end of its last save, or, every third trial, while a checkpoint file of a randomly
chosen validation is being saved (the moment its temporary file appears). After the kill it checks
that every checkpoint loads, every metrics line parses and no checkpoint lacks the metrics line of
its step; then it continues the run (`attn train --resume`, or a new `attn train` into the same
directory when no last.pt was published yet) and checks that the finished run equals the reference
bitwise: every checkpoint's weights, last.pt's optimizer, schedule and random states, and every
metrics line but its time.

The other parts:
- planted: a checkpoint holding a pickled object that would touch a marker file when unpickled (the
  whole file, or hidden in the metrics of a valid checkpoint), for every command that loads one;
  each must exit non-zero with a one-line error, and the marker must never appear.
- concurrent: two `attn train` started at once into one run directory; one trains to the end and
  equals the reference, the other is refused with a line naming the first one's PID.
- disk-full: training on a small tmpfs that fills up while the config, the split files, the tokenizer,
  a metrics line or a checkpoint is being written (needs the right to mount; skipped with the reason
  otherwise); each must end with a one-line error and leave nothing half-written that the next run,
  once there is room again, would reuse: that run must equal the reference. Also translating to a
  full device: stdout on /dev/full, and --output naming a private copy of that device.

Run from the repository root (about 4 minutes on 2 CPU cores for 20 trials and the other parts):

    python3 tests/support/chaos.py --trials 20
    python3 tests/support/chaos.py --trials 3 --seed 7 --parts trials planted --json chaos.json --keep

It prints a table of the trials and a summary, writes the summary as JSON with --json, and exits with
status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from attn_cli.checkpoint import Checkpoint, load_checkpoint

REPO = Path(__file__).resolve().parents[2]  # the attn commands below run this checkout's code

# The run every part trains: the built-in tiny config with dropout on (so a resume must also continue
# the random streams), a validation and three or four checkpoint files every 10 steps (last.pt,
# best.pt, step-N.pt, the oldest of the kept step checkpoints pruned), and no BLEU (decoding with an
# untrained model takes seconds per validation and checks nothing more here). One thread: two
# processes with two threads each on two shared cores run many times slower than with one.
RUN_SETTINGS = [
    "model.dropout=0.1",
    "train.valid_every=10",
    "train.keep_last=3",
    "train.valid_bleu=false",
    "train.threads=1",
]
PARTS = ("trials", "planted", "concurrent", "disk-full")
COMMAND_TIMEOUT = 600  # seconds; a command that hangs this long has failed
POLL_SECONDS = 0.0002  # how often a save is looked for; a save of the tiny model takes milliseconds
PAGE = 4096  # tmpfs counts whole pages
LARGE_FILESYSTEM = "256m"  # room enough for a whole tiny run
TEMPORARY = re.compile(r"\.(?P<name>.+)\.[^.]+\.tmp")  # checkpoint.save_checkpoint's .NAME.XXXX.tmp


# -- running attn ---------------------------------------------------------------------------------


@dataclass
class Finished:
    """What one attn command did."""

    args: list[str]
    pid: int
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def error_problems(self) -> list[str]:
        """What keeps this run's failure from being a plain one-line error: a zero exit, a traceback,
        no "error:" line or several."""
        problems = []
        if self.returncode == 0:
            problems.append("exited with status 0")
        if self.timed_out:
            problems.append(f"still running after {COMMAND_TIMEOUT} s")
        if "Traceback" in self.output:
            problems.append("printed a traceback: " + self.last_line())
        elif len(self.error_lines()) != 1:
            problems.append(f"{len(self.error_lines())} error lines instead of one: {self.last_line()}")
        return problems

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    def error(self, run_dir: Path) -> str:
        """The error line (else the last line), with `run_dir` shown as RUN to keep tables narrow."""
        lines = self.error_lines() or [self.last_line()]
        return lines[0].replace(str(run_dir), "RUN")

    def last_line(self) -> str:
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else "(no output)"


class AttnProcess:
    """One attn command running in the background; its output goes to files NAME.out and NAME.err in
    `logs` (a pipe nobody reads while the command runs could fill up and stall it)."""

    def __init__(self, args: list[str], logs: Path, name: str, stdout: Optional[Path] = None):
        logs.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.stdout_path = stdout or logs / f"{name}.out"
        self.stderr_path = logs / f"{name}.err"
        search_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        environment = dict(os.environ, PYTHONPATH=search_path)
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "attn_cli", *args],
                cwd=logs,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def kill(self) -> bool:
        """SIGKILL, if it still runs; whether it did."""
        if not self.running():
            return False
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return True

    def wait(self) -> Finished:
        timed_out = False
        try:
            self.process.wait(timeout=max(COMMAND_TIMEOUT - self.seconds(), 1))
        except subprocess.TimeoutExpired:
            timed_out = self.kill()
        seconds = self.seconds()
        stdout = "" if self.stdout_path.is_char_device() else self.stdout_path.read_text(errors="replace")
        return Finished(
            self.args,
            self.pid,
            self.process.returncode,
            stdout,
            self.stderr_path.read_text(errors="replace"),
            seconds,
            timed_out,
        )


def run_attn(args: list[str], logs: Path, name: str, stdout: Optional[Path] = None) -> Finished:
    return AttnProcess(args, logs, name, stdout).wait()


def train_args(run_dir: Path, steps: int) -> list[str]:
    settings = [*RUN_SETTINGS, f"train.max_steps={steps}", f"run_dir={run_dir}"]
    return ["train", "--config", "tiny.yaml", *[part for setting in settings for part in ("--set", setting)]]


# -- what a run directory holds -------------------------------------------------------------------


@dataclass
class RunState:
    """A run directory as the next command would find it."""

    checkpoints: dict[str, Checkpoint]  # file name -> the loaded checkpoint
    unloadable: list[str]  # "NAME: why"
    metrics: list[dict]  # the lines of metrics.jsonl that parse
    unparseable: list[str]  # "line N: text"
    temporaries: list[str]  # files a save or a tokenizer write cut short left behind

    def step(self, name: str) -> Optional[int]:
        return self.checkpoints[name].step if name in self.checkpoints else None

    def metric_steps(self) -> list[int]:
        return [line["step"] for line in self.metrics]


def inspect_run(run_dir: Path) -> RunState:
    """Load every checkpoint and parse every metrics line of `run_dir`."""
    checkpoint_dir = run_dir / "checkpoints"
    files = sorted(checkpoint_dir.glob("*.pt")) if checkpoint_dir.is_dir() else []
    checkpoints, unloadable = {}, []
    for path in files:
        try:
            checkpoints[path.name] = load_checkpoint(path)
        except Exception as error:  # a CheckpointError, or a bug of its own: either way the file does not load
            unloadable.append(f"{path.name}: {type(error).__name__}: {error}")
    metrics, unparseable = [], []
    log = run_dir / "metrics.jsonl"
    for number, line in enumerate(log.read_text(encoding="utf-8").splitlines() if log.is_file() else [], 1):
        try:
            parsed = json.loads(line)
            if not isinstance(parsed.get("step"), int):
                raise ValueError("no step")
            metrics.append(parsed)
        except (ValueError, AttributeError):
            unparseable.append(f"line {number}: {line[:60]!r}")
    temporaries = [
        str(path.relative_to(run_dir))
        for folder in (checkpoint_dir, run_dir / "tokenizer")
        if folder.is_dir()
        for path in folder.glob(".*.tmp")
    ]
    return RunState(checkpoints, unloadable, metrics, unparseable, sorted(temporaries))


def same(left, right) -> bool:
    """Bitwise equality of nested dicts, lists and tensors."""
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return isinstance(right, (list, tuple)) and len(left) == len(right) and all(map(same, left, right))
    return left == right


def without_time(metrics: dict) -> dict:
    """A metrics line without what depends on the clock: the rest must repeat exactly."""
    return {key: value for key, value in metrics.items() if key != "elapsed"}


# What must repeat exactly in last.pt besides the weights; the training time and the best metrics
# (which hold the time of their validation) may differ.
RESUME_STATE = (
    "optimizer",
    "scheduler",
    "grad_scaler",
    "rng_by_rank",
    "batches_done",
    "validated_step",
    "nonfinite_steps",
    "early_stopping",
)


@dataclass
class Reference:
    """The unbroken run every other run must end equal to."""

    run_dir: Path
    seconds: float  # its wall time
    last_save: float  # seconds from its start to the end of its last save: the range of the timed kills
    state: RunState

    @property
    def steps(self) -> list[int]:
        return self.state.metric_steps()

    def saves_at(self, step: int) -> list[str]:
        """The checkpoint files the validation at `step` writes: last.pt, best.pt when the validation
        loss improved (the config validates without BLEU), and step-N.pt."""
        losses = {line["step"]: line["valid_loss"] for line in self.state.metrics}
        earlier = [loss for s, loss in losses.items() if s < step]
        improved = not earlier or losses[step] < min(earlier)
        return ["last.pt", *(["best.pt"] if improved else []), f"step-{step:06d}.pt"]

    def lost_lines(self, state: RunState, finished: bool) -> list[int]:
        """The reference's validation steps missing from `state`'s metrics: all of them for a finished
        run; for an interrupted one those up to its latest line or checkpoint."""
        reached = max([*state.metric_steps(), *(c.step for c in state.checkpoints.values()), 0])
        return [step for step in self.steps if (finished or step <= reached) and step not in state.metric_steps()]

    def differences(self, state: RunState) -> list[str]:
        """How a finished run's checkpoints and metrics differ from the reference's; none when equal."""
        found = []
        expected, actual = set(self.state.checkpoints), set(state.checkpoints)
        if expected != actual:
            found.append(f"checkpoints {sorted(actual)} instead of {sorted(expected)}")
        for name in sorted(expected & actual):
            mine, theirs = state.checkpoints[name], self.state.checkpoints[name]
            if (mine.step, mine.epoch) != (theirs.step, theirs.epoch):
                found.append(
                    f"{name} is of step {mine.step}, epoch {mine.epoch} instead of {theirs.step}, epoch {theirs.epoch}"
                )
            elif not same(mine.model.state_dict(), theirs.model.state_dict()):
                found.append(f"{name}: weights differ")
        if "last.pt" in expected & actual and self.state.step("last.pt") == state.step("last.pt"):
            mine, theirs = state.checkpoints["last.pt"].training_state, self.state.checkpoints["last.pt"].training_state
            differing = [key for key in RESUME_STATE if not same(mine.get(key), theirs.get(key))]
            if differing:
                found.append(f"last.pt: {', '.join(differing)} differ")
        steps = state.metric_steps()
        if steps != self.steps:
            found.append(f"metrics of steps {steps} instead of {self.steps}")
        elif [without_time(m) for m in state.metrics] != [without_time(m) for m in self.state.metrics]:
            found.append("metrics values differ")
        return found

    def is_exact(self, state: RunState) -> bool:
        """Whether last.pt holds bitwise the reference's weights and resume state."""
        mine, theirs = state.checkpoints.get("last.pt"), self.state.checkpoints["last.pt"]
        if mine is None or mine.step != theirs.step:
            return False
        return same(mine.model.state_dict(), theirs.model.state_dict()) and all(
            same(mine.training_state.get(key), theirs.training_state.get(key)) for key in RESUME_STATE
        )


def consistency_problems(state: RunState, reference: Reference, finished: bool) -> list[str]:
    """What an interrupted (or finished) run directory must never show: a checkpoint that does not
    load, a metrics line that does not parse, a validation step without its line, a line twice."""
    problems = [f"unloadable {entry}" for entry in state.unloadable]
    problems += [f"unparseable metrics {entry}" for entry in state.unparseable]
    lost = reference.lost_lines(state, finished)
    if lost:
        problems.append(f"no metrics line for steps {lost}")
    steps = state.metric_steps()
    if len(set(steps)) != len(steps) or not set(steps) <= set(reference.steps):
        problems.append(f"metrics of steps {steps}, the reference's are {reference.steps}")
    return problems


def train_reference(workdir: Path, steps: int) -> Reference:
    run_dir = workdir / "reference" / "run"
    started = time.time()
    finished = run_attn(train_args(run_dir, steps), run_dir.parent, "train")
    if finished.returncode != 0:
        raise SystemExit(f"the reference run failed:\n{finished.output}")
    state = inspect_run(run_dir)
    if state.unloadable or state.unparseable or "last.pt" not in state.checkpoints:
        raise SystemExit(f"the reference run left a broken run directory: {state.unloadable + state.unparseable}")
    # A save renames its finished file into place, so the newest checkpoint's time is when the last
    # save ended; after it the run only exits, and a kill drawn there would mostly find it gone.
    last_save = max(path.stat().st_mtime for path in (run_dir / "checkpoints").glob("*.pt")) - started
    return Reference(run_dir, finished.seconds, last_save, state)


# -- kill -9 trials -------------------------------------------------------------------------------


@dataclass
class KillMoment:
    """When a trial kills the run: `seconds` after its start, or during the save of checkpoint file
    `file` at the validation of `step` (as soon as its temporary file appears)."""

    seconds: Optional[float] = None
    step: Optional[int] = None
    file: Optional[str] = None

    def describe(self) -> str:
        return f"at {self.seconds:.2f} s" if self.seconds is not None else f"saving {self.file} of step {self.step}"


def plan_moments(rng: random.Random, trials: int, reference: Reference) -> list[KillMoment]:
    """Every third trial kills during a save (a random file of a random validation), the others at a
    uniformly random time between the start and the end of the reference's last save."""
    moments = []
    for number in range(1, trials + 1):
        if number % 3 == 0:
            step = rng.choice(reference.steps)
            moments.append(KillMoment(step=step, file=rng.choice(reference.saves_at(step))))
        else:
            moments.append(KillMoment(seconds=round(rng.uniform(0, reference.last_save), 2)))
    return moments


def latest_metrics_step(run_dir: Path) -> int:
    """The step of metrics.jsonl's last line; 0 before the first (a line written halfway counts as none)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def saving(checkpoint_dir: Path, name: str) -> bool:
    """Whether a temporary file of a save of `name` is in `checkpoint_dir` now."""
    try:
        entries = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return False
    return any((match := TEMPORARY.fullmatch(entry)) and match["name"] == name for entry in entries)


def kill_during_save(process: AttnProcess, run_dir: Path, step: int, name: str) -> bool:
    """SIGKILL as soon as the save of `name` at the validation of `step` has begun. Its metrics line
    comes just before its saves; if the save slips by unseen, the kill follows at once."""
    while process.running() and latest_metrics_step(run_dir) < step:
        time.sleep(POLL_SECONDS)
    while process.running() and latest_metrics_step(run_dir) == step and not saving(run_dir / "checkpoints", name):
        time.sleep(POLL_SECONDS)
    return process.kill()


def kill_at(process: AttnProcess, moment: KillMoment, run_dir: Path) -> bool:
    """Kill the run at `moment`; whether it was still running then."""
    if moment.seconds is None:
        return kill_during_save(process, run_dir, moment.step, moment.file)
    while process.running() and process.seconds() < moment.seconds:
        time.sleep(0.01)
    return process.kill()


def where_it_landed(state: RunState, stderr: str, reference: Reference) -> str:
    """Where in the run the kill came, as far as its files and log tell."""
    saves = [
        match
        for path in state.temporaries
        if (match := TEMPORARY.fullmatch(Path(path).name)) and path.startswith("checkpoints")
    ]
    if saves:
        return f"saving {saves[0]['name']} of step {max(state.metric_steps(), default=0)}"
    if state.temporaries:
        return "saving the tokenizer"
    if "effective batch:" not in stderr:  # setup's last log line
        return "setup"
    last, line = state.step("last.pt"), max(state.metric_steps(), default=0)
    if line and line != last:
        return f"after metrics line {line}, before its last.pt"
    missing = [name for name in reference.saves_at(last) if state.step(name) != last] if last else []
    if missing:
        return f"after last.pt of step {last}, before {missing[0]}"
    return f"training after step {last}" if last else "training, before the first checkpoint"


@dataclass
class TrialResult:
    number: int
    moment: str
    killed: bool
    landed: str
    killed_after_seconds: float
    checkpoints_after_kill: int
    unloadable: int  # checkpoint files that did not load, after the kill and after the resume
    unparseable: int  # metrics lines that did not parse, likewise
    lost_lines: int  # validation steps without their metrics line, likewise
    resumed_with: str
    exact: bool
    problems: list[str] = field(default_factory=list)


def run_trial(number: int, moment: KillMoment, workdir: Path, reference: Reference, steps: int) -> TrialResult:
    """Train, kill at `moment`, check the run directory, continue the run and compare it with the reference."""
    trial_dir = workdir / f"trial-{number:02d}"
    run_dir = trial_dir / "run"
    process = AttnProcess(train_args(run_dir, steps), trial_dir, "killed")
    killed = kill_at(process, moment, run_dir)
    killed_after = process.seconds()
    interrupted = process.wait()
    after_kill = inspect_run(run_dir)
    problems = [f"after the kill: {p}" for p in consistency_problems(after_kill, reference, finished=False)]
    if not killed and interrupted.returncode != 0:
        problems.append(f"the run failed before the kill: {interrupted.last_line()}")
    landed = where_it_landed(after_kill, interrupted.stderr, reference) if killed else "finished before the kill"

    # Without a published checkpoint there is nothing to resume: the run starts over in its directory.
    resume = ["--resume"] if any((run_dir / "checkpoints").glob("*.pt")) else []
    continued = run_attn(train_args(run_dir, steps) + resume, trial_dir, "continued")
    after_resume = inspect_run(run_dir)
    if continued.returncode != 0:
        problems.append(f"the continued run exited with {continued.returncode}: {continued.last_line()}")
    problems += [f"after the resume: {p}" for p in consistency_problems(after_resume, reference, finished=True)]
    if after_resume.temporaries:
        problems.append(f"after the resume: temporary files left: {after_resume.temporaries}")
    problems += [f"after the resume: {d}" for d in reference.differences(after_resume)]
    return TrialResult(
        number,
        moment.describe(),
        killed,
        landed,
        round(killed_after, 2),
        len(after_kill.checkpoints),
        len(after_kill.unloadable) + len(after_resume.unloadable),
        len(after_kill.unparseable) + len(after_resume.unparseable),
        len(reference.lost_lines(after_kill, False)) + len(reference.lost_lines(after_resume, True)),
        "--resume" if resume else "a new run",
        reference.is_exact(after_resume),
        problems,
    )


def print_trial(result: TrialResult) -> None:
    outcome = "ok" if not result.problems else "FAIL: " + "; ".join(result.problems)
    print(
        f"| {result.number} | {result.moment} | {result.landed} | {result.checkpoints_after_kill} | "
        f"{result.unloadable} | {result.lost_lines} | {result.resumed_with} | {'yes' if result.exact else 'NO'} | "
        f"{outcome} |",
        flush=True,
    )


def run_trials(trials: int, seed: int, workdir: Path, reference: Reference, steps: int) -> list[TrialResult]:
    print(
        f"\n## {trials} kill -9 trials (seed {seed}; the reference run took {reference.seconds:.1f} s, its last "
        f"save ended at {reference.last_save:.1f} s; {len(reference.steps)} validations, steps "
        f"{reference.steps[0]} to {reference.steps[-1]})\n"
    )
    print(
        "| trial | kill | landed | checkpoints left | unloadable | lost metrics lines | continued with | "
        "exact | result |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for number, moment in enumerate(plan_moments(random.Random(seed), trials, reference), 1):
        results.append(run_trial(number, moment, workdir, reference, steps))
        print_trial(results[-1])
    return results


# -- planted checkpoints --------------------------------------------------------------------------


class PlantedCode:
    """Unpickling this object touches `marker`: the stand-in for the code a malicious checkpoint runs."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(path: Path, marker: Path, hidden: bool) -> None:
    """Replace the checkpoint at `path` with the planted object itself, or (`hidden`) with the valid
    checkpoint that carries it among its metrics."""
    if hidden:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        payload["metrics"] = {"valid_loss": PlantedCode(marker)}
        torch.save(payload, path)
    else:
        torch.save(PlantedCode(marker), path)


@dataclass
class PlantedResult:
    command: str
    planted: str
    returncode: int
    error: str
    code_ran: bool
    problems: list[str]


def loading_commands(reference: Reference, steps: int) -> list[tuple[str, str, Callable[[Path], list[str]]]]:
    """Every command that loads a checkpoint: its name, the checkpoint file it loads, and its
    arguments for a copy of the reference run at the given path."""
    newest_step = sorted(name for name in reference.state.checkpoints if name.startswith("step-"))[-1]
    keep_last = sum(name.startswith("step-") for name in reference.state.checkpoints)

    def best(run: Path) -> str:
        return str(run / "checkpoints" / "best.pt")

    return [
        ("translate --checkpoint", "best.pt", lambda run: ["translate", "--checkpoint", best(run), "Hello."]),
        ("translate --run", "best.pt", lambda run: ["translate", "--run", str(run), "Hello."]),
        ("eval --checkpoint", "best.pt", lambda run: ["eval", "--checkpoint", best(run)]),
        ("eval --run", "best.pt", lambda run: ["eval", "--run", str(run)]),
        ("average --run", newest_step, lambda run: ["average", "--run", str(run), "--last", str(keep_last)]),
        ("train --resume", "last.pt", lambda run: train_args(run, steps) + ["--resume"]),
    ]


def planted_checks(workdir: Path, reference: Reference, steps: int) -> list[PlantedResult]:
    print("\n## Planted checkpoints\n")
    print("| command | planted | exit | error | code ran | result |")
    print("|---|---|---|---|---|---|", flush=True)
    results = []
    for command, file, args in loading_commands(reference, steps):
        for planted, hidden in (("the whole file", False), ("inside a valid checkpoint", True)):
            case_dir = workdir / "planted" / f"{command.replace(' --', '-')}-{'hidden' if hidden else 'whole'}"
            run_dir = case_dir / "run"
            shutil.copytree(reference.run_dir, run_dir)
            marker = case_dir / "the-planted-code-ran"
            plant(run_dir / "checkpoints" / file, marker, hidden)
            finished = run_attn(args(run_dir), case_dir, "command")
            problems = finished.error_problems()
            error = finished.error(run_dir)
            if file not in error:
                problems.append(f"the error does not name {file}")
            if marker.exists():
                problems.append("THE PLANTED CODE RAN")
            results.append(PlantedResult(command, planted, finished.returncode, error, marker.exists(), problems))
            outcome = "ok" if not problems else "FAIL: " + "; ".join(problems)
            print(
                f"| `attn {command}` | {planted} | {finished.returncode} | {error} | "
                f"{'YES' if marker.exists() else 'no'} | {outcome} |",
                flush=True,
            )
    return results


# -- two trainings at once ------------------------------------------------------------------------


@dataclass
class ConcurrentResult:
    exits: list[int]
    refusal: str
    problems: list[str]


def concurrent_check(workdir: Path, reference: Reference, steps: int) -> ConcurrentResult:
    """Start two trainings into one new run directory at the same moment: whichever takes the run's
    lock first must train to the end, the other must be refused naming its PID."""
    print("\n## Two trainings at once\n", flush=True)
    case_dir = workdir / "concurrent"
    run_dir = case_dir / "run"
    processes = [AttnProcess(train_args(run_dir, steps), case_dir, name) for name in ("first", "second")]
    finished = [process.wait() for process in processes]
    winners = [f for f in finished if f.returncode == 0]
    problems, refusal = [], ""
    if len(winners) != 1:
        problems.append(f"exits {[f.returncode for f in finished]}: exactly one must finish")
    else:
        loser = next(f for f in finished if f is not winners[0])
        refusal = loser.error(run_dir)
        problems += [f"the refused one: {p}" for p in loser.error_problems()]
        if f"PID {winners[0].pid}" not in refusal:
            problems.append(f"the refusal does not name PID {winners[0].pid}")
        state = inspect_run(run_dir)
        problems += consistency_problems(state, reference, finished=True)
        problems += reference.differences(state)
    for name, result in zip(("first", "second"), finished):
        print(
            f"- {name} `attn train` (PID {result.pid}): exit {result.returncode} after {result.seconds:.1f} s: "
            f"{result.last_line().replace(str(run_dir), 'RUN')}"
        )
    outcome = "ok, the run that trained equals the reference" if not problems else "FAIL: " + "; ".join(problems)
    print(f"- result: {outcome}", flush=True)
    return ConcurrentResult([f.returncode for f in finished], refusal, problems)


# -- a full disk ----------------------------------------------------------------------------------


@dataclass
class DiskFullCase:
    """A filesystem with `room` for part of a run: the write after that part fills it up."""

    room: str  # what fits, in words
    size: int  # bytes
    kept_step: Optional[int] = None  # the step of the last.pt that must survive the failed save


def pages(path: Path) -> int:
    """The tmpfs pages the files under `path` (or the file itself) take."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(-(-p.stat().st_size // PAGE) for p in files)


def disk_full_cases(reference: Reference) -> list[DiskFullCase]:
    """Filesystems that fill up at each kind of file a run writes, sized by the reference's files
    (the error then names the file that did not fit)."""
    run = reference.run_dir
    lock = pages(run / ".lock")
    config = lock + pages(run / "config.yaml")
    splits = config + pages(run / "data")
    tokenizer = splits + pages(run / "tokenizer")
    checkpoint = pages(run / "checkpoints" / "last.pt")
    # The first validation writes its metrics line, last.pt, best.pt and step-N.pt; the second
    # one's last.pt does not fit beside them.
    first_validation = tokenizer + pages(run / "metrics.jsonl") + 3 * checkpoint + checkpoint // 2
    return [
        DiskFullCase("the lock file", lock * PAGE),
        DiskFullCase("config.yaml and a page", (config + 1) * PAGE),
        DiskFullCase("the split files and a page", (splits + 1) * PAGE),
        DiskFullCase("all before the first metrics line", tokenizer * PAGE),
        DiskFullCase("the first validation's files", first_validation * PAGE, kept_step=reference.steps[0]),
    ]


def mount(*args: str) -> Optional[str]:
    """Run mount or umount; None when it worked, else why not."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True)
    except FileNotFoundError:
        return f"{args[0]} is not installed"
    if done.returncode == 0:
        return None
    return done.stderr.strip().splitlines()[0] if done.stderr.strip() else f"{args[0]} exited with {done.returncode}"


@dataclass
class DiskFullResult:
    case: str
    returncode: int
    error: str
    checkpoints_left: dict[str, int]  # name -> step
    next_run: str
    problems: list[str]


def disk_full_case(case_dir: Path, case: DiskFullCase, reference: Reference, steps: int) -> DiskFullResult:
    """Train on a tmpfs of the case's size, check the failure and what it left, then give the
    filesystem room and run again: that run must end equal to the reference, so it reused nothing
    half-written."""
    described = f"room for {case.room} ({case.size // 1024} KiB)"
    mount_point = case_dir / "filesystem"
    mount_point.mkdir(parents=True)
    why_not = mount("mount", "-t", "tmpfs", "-o", f"size={case.size}", "tmpfs", str(mount_point))
    if why_not:
        return DiskFullResult(described, 0, "", {}, "", [f"SKIPPED: cannot mount a tmpfs: {why_not}"])
    try:
        run_dir = mount_point / "run"
        full = run_attn(train_args(run_dir, steps), case_dir, "full")
        left = inspect_run(run_dir)
        problems = full.error_problems() + consistency_problems(left, reference, finished=False)
        if left.temporaries:
            problems.append(f"temporary files left: {left.temporaries}")
        if case.kept_step is not None and left.step("last.pt") != case.kept_step:
            problems.append(f"last.pt of step {left.step('last.pt')}, not the previous one ({case.kept_step})")
        mount("mount", "-o", f"remount,size={LARGE_FILESYSTEM}", str(mount_point))
        resume = ["--resume"] if any((run_dir / "checkpoints").glob("*.pt")) else []
        again = run_attn(train_args(run_dir, steps) + resume, case_dir, "again")
        if again.returncode != 0:
            problems.append(f"the next run failed: {again.last_line()}")
        else:
            problems += [f"the next run: {d}" for d in reference.differences(inspect_run(run_dir))]
        return DiskFullResult(
            described,
            full.returncode,
            full.error(run_dir),
            {name: c.step for name, c in left.checkpoints.items()},
            f"{'--resume' if resume else 'a new run'}: exit {again.returncode}",
            problems,
        )
    finally:
        mount("umount", str(mount_point))


def full_device_checks(case_dir: Path, reference: Reference) -> list[DiskFullResult]:
    """Translating to a full device: stdout on /dev/full, and --output naming a character device like
    /dev/full. That one is a private node made here, so that a command that replaced the file it
    names would not replace the system's."""
    checkpoint = str(reference.run_dir / "checkpoints" / "best.pt")
    results = []
    system_full = Path("/dev/full")
    if system_full.is_char_device():
        finished = run_attn(["translate", "--checkpoint", checkpoint, "Hello."], case_dir, "stdout", stdout=system_full)
        results.append(_device_result("stdout on /dev/full", finished, system_full))
    else:
        results.append(DiskFullResult("stdout on /dev/full", 0, "", {}, "", ["SKIPPED: no /dev/full here"]))
    device = case_dir / "full"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # the numbers of /dev/full
    except OSError as error:
        results.append(
            DiskFullResult(
                "--output on a full device", 0, "", {}, "", [f"SKIPPED: cannot make a device node: {error.strerror}"]
            )
        )
        return results
    finished = run_attn(
        ["translate", "--checkpoint", checkpoint, "--output", str(device), "Hello."], case_dir, "output"
    )
    results.append(_device_result("--output on a full device", finished, device))
    return results


def _device_result(case: str, finished: Finished, device: Path) -> DiskFullResult:
    problems = finished.error_problems()
    if not device.is_char_device():
        problems.append(f"{device} was replaced: it is no longer a device")
    return DiskFullResult(case, finished.returncode, finished.error(device.parent), {}, "", problems)


def disk_full_checks(workdir: Path, reference: Reference, steps: int) -> list[DiskFullResult]:
    print("\n## A full disk\n")
    print("| filesystem or device | exit | error | checkpoints left | next run, with room | result |")
    print("|---|---|---|---|---|---|", flush=True)
    results = []
    for number, case in enumerate(disk_full_cases(reference), 1):
        results.append(disk_full_case(workdir / "disk-full" / f"case-{number}", case, reference, steps))
        _print_disk_full(results[-1])
    for result in full_device_checks(workdir / "disk-full", reference):
        results.append(result)
        _print_disk_full(result)
    return results


def _print_disk_full(result: DiskFullResult) -> None:
    if skipped(result):
        print(f"| {result.case} | | | | | {result.problems[0]} |", flush=True)
        return
    left = ", ".join(f"{name} (step {step})" for name, step in sorted(result.checkpoints_left.items())) or "none"
    outcome = "ok" if not result.problems else "FAIL: " + "; ".join(result.problems)
    print(
        f"| {result.case} | {result.returncode} | {result.error} | {left} | {result.next_run} | {outcome} |", flush=True
    )


def skipped(result: DiskFullResult) -> bool:
    return bool(result.problems) and result.problems[0].startswith("SKIPPED")


# -- the whole --------------------------------------------------------------------------------------


def summarize(
    trials: list[TrialResult],
    planted: list[PlantedResult],
    concurrent: Optional[ConcurrentResult],
    disk_full: list[DiskFullResult],
) -> dict:
    return {
        "trials": len(trials),
        "killed": sum(t.killed for t in trials),
        "killed_during_a_save": sum(t.landed.startswith("saving") for t in trials),
        "killed_during_setup": sum(t.landed == "setup" for t in trials),
        "unloadable_files": sum(t.unloadable for t in trials),
        "unparseable_metrics_lines": sum(t.unparseable for t in trials),
        "lost_metrics_lines": sum(t.lost_lines for t in trials),
        "exact_resumes": sum(t.exact for t in trials),
        "planted_refused": sum(not p.problems for p in planted),
        "planted_code_ran": sum(p.code_ran for p in planted),
        "planted_cases": len(planted),
        "concurrent_ok": None if concurrent is None else not concurrent.problems,
        "disk_full_ok": sum(not r.problems for r in disk_full),
        "disk_full_skipped": sum(skipped(r) for r in disk_full),
        "disk_full_cases": len(disk_full),
        "failures": sum(bool(t.problems) for t in trials)
        + sum(bool(p.problems) for p in planted)
        + (1 if concurrent is not None and concurrent.problems else 0)
        + sum(bool(r.problems) and not skipped(r) for r in disk_full),
    }


def print_summary(totals: dict) -> None:
    print("\n## Summary\n")
    if totals["trials"]:
        print(
            f"- kill -9 trials: {totals['trials']} ({totals['killed']} killed: {totals['killed_during_setup']} "
            f"during setup, {totals['killed_during_a_save']} during a save); {totals['unloadable_files']} "
            f"unloadable files, {totals['unparseable_metrics_lines']} unparseable and "
            f"{totals['lost_metrics_lines']} lost metrics lines, {totals['exact_resumes']} of {totals['trials']} "
            f"exact resumes"
        )
    if totals["planted_cases"]:
        print(
            f"- planted checkpoints: {totals['planted_refused']} of {totals['planted_cases']} refused in one line; "
            f"the planted code ran {totals['planted_code_ran']} times"
        )
    if totals["concurrent_ok"] is not None:
        print(f"- two trainings at once: {'ok' if totals['concurrent_ok'] else 'FAIL'}")
    if totals["disk_full_cases"]:
        print(
            f"- full disk: {totals['disk_full_ok']} of {totals['disk_full_cases']} ok, "
            f"{totals['disk_full_skipped']} skipped"
        )
    print(f"- failures: {totals['failures']}", flush=True)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="kill -9 trials (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments, so a set of trials repeats")
    parser.add_argument("--steps", type=int, default=200, help="train.max_steps of every run (default 200)")
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run (default all)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="where the runs go (kept); default a temporary folder, removed after"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder of the runs")
    parser.add_argument("--json", type=Path, help="write the results and the summary here as JSON")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="attn-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"attn chaos: {' '.join(args.parts)}; runs in {workdir}", flush=True)
    try:
        reference = train_reference(workdir, args.steps)
        trials = run_trials(args.trials, args.seed, workdir, reference, args.steps) if "trials" in args.parts else []
        planted = planted_checks(workdir, reference, args.steps) if "planted" in args.parts else []
        concurrent = concurrent_check(workdir, reference, args.steps) if "concurrent" in args.parts else None
        disk_full = disk_full_checks(workdir, reference, args.steps) if "disk-full" in args.parts else []
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    totals = summarize(trials, planted, concurrent, disk_full)
    print_summary(totals)
    if args.json:
        results = {
            "seed": args.seed,
            "steps": args.steps,
            "settings": RUN_SETTINGS,
            "reference_seconds": round(reference.seconds, 2),
            "reference_last_save_seconds": round(reference.last_save, 2),
            "reference_steps": reference.steps,
            "trials": [dataclasses.asdict(t) for t in trials],
            "planted": [dataclasses.asdict(p) for p in planted],
            "concurrent": dataclasses.asdict(concurrent) if concurrent else None,
            "disk_full": [dataclasses.asdict(r) for r in disk_full],
            "summary": totals,
        }
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 1 if totals["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
