"""The contributor's tooling agrees with itself: the pre-commit hooks are the checks of
scripts/test, and CHANGELOG.md keeps the Keep a Changelog form (CONTRIBUTING.md)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

CHANGELOG_KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def check_commands(script: str) -> list[list[str]]:
    """The check commands of scripts/test: its lines ``run "<name>" <command...>``."""
    commands = []
    for line in script.splitlines():
        match = re.match(r'\s*run "[^"]+" (.+)$', line)
        if match:
            commands.append(shlex.split(match.group(1)))
    return commands


def test_pre_commit_runs_exactly_the_checks_of_scripts_test() -> None:
    checks = check_commands((REPO / "scripts" / "test").read_text())
    assert len(checks) >= 4, checks
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert all(repo["repo"] == "local" for repo in config["repos"]), "nothing fetched at run time"
    entries = []
    for hook in hooks:
        assert hook["language"] == "system", hook["id"]
        assert hook["pass_filenames"] is False, f"{hook['id']} must check the whole tree"
        argv = shlex.split(hook["entry"])
        assert argv[0].startswith(".venv/bin/"), (
            "the project's pinned tools, not whatever is on PATH"
        )
        entries.append([argv[0].removeprefix(".venv/bin/"), *argv[1:]])
    assert entries == checks


def test_changelog_keeps_the_form() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.MULTILINE)
    assert versions, "no version section"
    assert versions[0] == ("Unreleased", ""), "## [Unreleased] comes first"
    released = [tuple(int(n) for n in v.split(".")) for v, _ in versions[1:]]
    assert all(date for _, date in versions[1:]), "a released version carries its date"
    assert released == sorted(released, reverse=True), "newest first"
    kinds = re.findall(r"^### (.+)$", text, flags=re.MULTILINE)
    assert set(kinds) <= CHANGELOG_KINDS, set(kinds) - CHANGELOG_KINDS
