"""The console's JavaScript unit tests (tests/js), on Node's own test runner, as part of the unit
tier: no browser, nothing downloaded. Node is Debian's ``nodejs`` (scripts/test installs it when
it is missing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The tests in tests/js when this was written: fewer passing means some were not run.
AT_LEAST = 28


def test_the_console_javascript_unit_tests_pass() -> None:
    node = shutil.which("node")
    assert node, "node is missing: install Debian's nodejs (scripts/test does, as root)"
    done = subprocess.run(
        [node, "--test", "--test-reporter=tap", "tests/js/"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    report = done.stdout + done.stderr
    summary = {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail) (\d+)$", report, re.M)}
    assert done.returncode == 0 and summary.get("fail") == 0, report[-8000:]
    assert summary["pass"] >= AT_LEAST, report[-8000:]
