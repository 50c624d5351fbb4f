"""The repository stands on its own: nothing in it points outside it."""

import subprocess

from support.runs import REPO


def test_no_tracked_file_points_at_a_shared_folder_beside_the_repository():
    outside = "../" + "shared"  # spelled apart, so this file does not find itself
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert files, "git ls-files listed nothing"
    mentioning = [
        name
        for name in files
        if (REPO / name).is_file() and outside in (REPO / name).read_bytes().decode("utf-8", "replace")
    ]
    assert mentioning == []
