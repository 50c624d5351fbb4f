"""scripts/chaos.py, small enough for every test run: three kill -9 trials, the planted checkpoints
for every command that loads one, two trainings at once and a full disk report no failure."""

import json
import subprocess
import sys

from conftest import REPO


def test_kill_trials_planted_checkpoints_two_trainings_at_once_and_a_full_disk_report_no_failure(tmp_path):
    report = tmp_path / "chaos.json"
    # 60 steps: six validations, so that a kill during a save has saves to land in, in a run of seconds.
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chaos.py"),
            "--trials",
            "3",
            "--steps",
            "60",
            "--parts",
            "trials",
            "planted",
            "concurrent",
            "disk-full",
            "--workdir",
            str(tmp_path / "runs"),
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(report.read_text())
    summary = results["summary"]
    assert summary["failures"] == 0, done.stdout
    assert summary["trials"] == 3 and summary["exact_resumes"] == 3, done.stdout
    assert (summary["unloadable_files"], summary["unparseable_metrics_lines"], summary["lost_metrics_lines"]) == (
        0,
        0,
        0,
    )
    assert any(trial["moment"].startswith("saving") for trial in results["trials"]), "one trial kills during a save"
    commands = {case["command"] for case in results["planted"]}
    assert commands == {
        "translate --checkpoint",
        "translate --run",
        "eval --checkpoint",
        "eval --run",
        "average --run",
        "train --resume",
    }
    assert summary["planted_refused"] == summary["planted_cases"] == 12 and summary["planted_code_ran"] == 0
    assert summary["concurrent_ok"] and sorted(results["concurrent"]["exits"]) == [0, 2]
    # Where the machine lets a tmpfs be mounted every case must pass; elsewhere those are skipped,
    # saying why, and the full device (stdout on /dev/full) is still tried.
    assert summary["disk_full_ok"] + summary["disk_full_skipped"] == summary["disk_full_cases"] > 0
    assert summary["disk_full_ok"] >= 1, "no full-disk case ran"
