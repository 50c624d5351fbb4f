"""The README's quickstart test command is what CI runs."""

import re

from support.runs import REPO


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(pip install [^\n]+)\n```", readme)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (REPO / ".ci" / "run").read_text(encoding="utf-8")
