"""The chaos trials (tests/support/chaos.py), each part a test: kill -9 at random moments and resume,
checkpoints with planted code for every command that loads one, two trainings at once, and a full
disk. Every part compares with one uninterrupted reference run of the tiny config.

ATTN_CHAOS_TRIALS (default 3) and ATTN_CHAOS_SEED (default 0) set the kill trials; a longer
campaign with a table and JSON: `python3 tests/support/chaos.py --trials 20`."""

from __future__ import annotations

import os

import pytest
from support import chaos

# 60 steps: six validations, so that a kill during a save has saves to land in, in a run of seconds.
STEPS = 60
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("chaos")
    return workdir, chaos.train_reference(workdir, STEPS)


def test_a_run_killed_at_random_moments_resumes_to_the_uninterrupted_run_bitwise(reference):
    workdir, run = reference
    trials = int(os.environ.get("ATTN_CHAOS_TRIALS", "3"))
    results = chaos.run_trials(trials, int(os.environ.get("ATTN_CHAOS_SEED", "0")), workdir, run, STEPS)
    assert len(results) == trials
    for trial in results:
        assert not trial.problems, f"trial {trial.number} ({trial.moment}, landed {trial.landed}): {trial.problems}"
        assert (trial.unloadable, trial.unparseable, trial.lost_lines) == (0, 0, 0)
        assert trial.exact
    assert any(trial.moment.startswith("saving") for trial in results), "one trial kills during a save"


def test_a_checkpoint_with_planted_code_is_refused_by_every_command_that_loads_one(reference):
    workdir, run = reference
    results = chaos.planted_checks(workdir, run, STEPS)
    assert {case.command for case in results} == {
        "translate --checkpoint",
        "translate --run",
        "eval --checkpoint",
        "eval --run",
        "average --run",
        "train --resume",
    }
    assert len(results) == 12  # each command: the whole file planted, and code hidden inside a valid one
    for case in results:
        assert not case.problems, f"{case.command}, {case.planted}: {case.problems}"
        assert not case.code_ran and case.returncode != 0


def test_two_trainings_into_one_run_directory_one_trains_the_other_is_refused(reference):
    workdir, run = reference
    result = chaos.concurrent_check(workdir, run, STEPS)
    assert not result.problems, result.problems
    assert sorted(result.exits) == [0, 2]


def test_a_full_disk_ends_in_one_line_and_leaves_nothing_half_written(reference):
    workdir, run = reference
    results = chaos.disk_full_checks(workdir, run, STEPS)
    assert results
    ran = [case for case in results if not chaos.skipped(case)]
    # Where the machine lets a tmpfs be mounted every case runs; elsewhere those are skipped, saying
    # why, and the full device (stdout on /dev/full) is still tried.
    assert ran, "no full-disk case ran"
    for case in ran:
        assert not case.problems, f"{case.case}: {case.problems}"
