"""The repository's own reference stays true to the code, and stands on its own.

- Every generated part of ``docs/reference.md`` (routes, environment, CLI, metrics, Python API)
  and ``docs/openapi.json`` equal what ``scripts/gen-reference`` makes from the code now.
- The hand-written parts name what the code has: every NOTIFY channel, runtime-config field,
  config event, task and worker status, ``TASKFLEET_*`` variable; the strict-cap table and the
  rotation example are the code's own results.
- Every link between the repository's documents resolves, anchors included.
- No file refers to a specification outside the repository.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import reference

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference.md"
FIX = "run scripts/gen-reference and commit the result"

#: Anchors other documents and the code link to; renaming a heading must not break them.
REQUIRED_ANCHORS = (
    "http-api",
    "authentication",
    "task-states",
    "scheduling",
    "worker-runtime",
    "runtime-config",
    "config-events",
    "notify-channels",
    "metrics",
    "environment",
    "cli",
    "python-api",
)


def slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = slug(match.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def section(anchor: str) -> str:
    """The text of the ``## `` section of docs/reference.md with this anchor, subsections
    included."""
    text = REFERENCE.read_text()
    parts = re.split(r"^(## .+)$", text, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        if slug(heading[3:]) == anchor:
            return body
    raise AssertionError(f"docs/reference.md has no section #{anchor}")


# --- generated parts -----------------------------------------------------------------------------


def generated_blocks(text: str) -> dict[str, str]:
    return {m.group("name"): m.group("body") for m in reference._BLOCK.finditer(text)}


@pytest.fixture(scope="module")
def rendered_reference() -> str:
    return reference.render_reference(REFERENCE.read_text())


@pytest.mark.parametrize("block", sorted(reference.RENDERERS))
def test_generated_block_matches_the_code(block: str, rendered_reference: str) -> None:
    """The settings-reference (``environment``) and CLI drift tests, and the others alike."""
    current = generated_blocks(REFERENCE.read_text())
    assert block in current, f"docs/reference.md lost its generated block {block!r}"
    assert current[block] == generated_blocks(rendered_reference)[block], (
        f"docs/reference.md: the generated {block!r} block differs from the code; {FIX}"
    )


def test_openapi_copy_matches_the_app() -> None:
    with reference.clean_environment():
        served = reference.api_app().openapi()
    copy = json.loads((REPO / "docs" / "openapi.json").read_text())
    assert copy == served, f"docs/openapi.json differs from create_app(...).openapi(); {FIX}"


def test_drift_is_detected() -> None:
    """The checks above can fail: a stale block is rendered anew, and --check says so."""
    text = REFERENCE.read_text()
    stale = reference._BLOCK.sub(
        lambda m: m.group("begin") + "| `TASKFLEET_GONE` | stale |\n" + m.group("end"), text
    )
    assert stale != text
    assert generated_blocks(reference.render_reference(stale)) == generated_blocks(
        reference.render_reference(text)
    )


def test_settings_documented_from_the_code_not_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKFLEET_CONCURRENCY", "77")
    monkeypatch.setenv("TASKFLEET_TASK_MODULES", "somebody.elses")
    with reference.clean_environment():
        environment = reference.render_environment()
    assert "`TASKFLEET_CONCURRENCY` | int (>= 1, <= 10000) | `10` |" in environment
    assert "somebody.elses" not in environment


def test_every_setting_says_what_it_is() -> None:
    undocumented = [
        f"{cls.__name__}.{name}"
        for cls in reference.settings_classes()
        for name, field in cls.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undocumented, f"settings without a description: {undocumented}"


def test_every_variable_the_code_names_is_documented() -> None:
    """A ``TASKFLEET_*`` name read anywhere in the package is in the environment section."""
    documented = section("environment")
    named: dict[str, Path] = {}
    for path in [*(REPO / "shared").rglob("*.py"), *(REPO / "services").rglob("*.py")]:
        for name in re.findall(r"\bTASKFLEET_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            named.setdefault(name, path)
    assert named, "the scan found no variable at all"
    missing = {n: str(p.relative_to(REPO)) for n, p in named.items() if f"`{n}`" not in documented}
    assert not missing, f"variables not in docs/reference.md#environment: {missing}"


def test_version_is_single_sourced() -> None:
    import taskfleet

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    version = pyproject["project"]["version"]
    assert taskfleet.__version__ == version
    with reference.clean_environment():
        assert reference.api_app().version == version
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(version)}\]", changelog, flags=re.MULTILINE), (
        f"CHANGELOG.md has no section for the version {version}"
    )


# --- the hand-written parts name what the code has ------------------------------------------------


def test_required_anchors_exist() -> None:
    missing = set(REQUIRED_ANCHORS) - anchors(REFERENCE.read_text())
    assert not missing, f"docs/reference.md lacks the anchors: {sorted(missing)}"


def test_notify_channels_are_documented() -> None:
    from taskfleet.shared import protocol

    text = section("notify-channels")
    for channel in protocol.CHANNELS:
        assert f"`{channel}`" in text, channel
    for payload in (
        protocol.config_updated_payload("<id>", 1),
        protocol.config_ack_payload("<id>", "<id>", 1),
    ):
        op = json.loads(payload)["op"]
        params = json.loads(payload)["params"]
        assert f'"op": "{op}"' in text
        for key in params:
            assert f'"{key}"' in text, key


def test_runtime_config_fields_are_documented() -> None:
    from taskfleet.shared.policy.runtime_config import KNOWN_FIELDS

    text = section("runtime-config")
    missing = [f for f in sorted(KNOWN_FIELDS) if f"`{f}`" not in text]
    assert not missing


def test_config_events_are_documented() -> None:
    from taskfleet.api.config_stream import FINAL_EVENTS
    from taskfleet.api.negotiation import OFFERED

    text = section("config-events")
    for event in ["enqueued", "version", "progress", *sorted(FINAL_EVENTS)]:
        assert f"`{event}`" in text, event
    for media_type in OFFERED:
        assert media_type in text, media_type


def test_statuses_are_documented() -> None:
    from taskfleet.shared.schema import TaskStatus, WorkerStatus

    text = section("task-states")
    for status in [*TaskStatus, *WorkerStatus]:
        assert f"`{status.value}`" in text, status


def _table_rows(text: str, header: str) -> Iterator[list[str]]:
    lines = text[text.index(header) :].splitlines()[2:]
    for line in lines:
        if not line.startswith("|"):
            return
        yield [cell.strip() for cell in line.strip("|").split("|")]


def test_strict_cap_table_is_the_code() -> None:
    from taskfleet.shared.policy.lanes import strict_cap

    rows = list(
        _table_rows(section("scheduling"), "| concurrency | maxStrictPercentage | strict cap |")
    )
    assert len(rows) >= 12
    for concurrency, percentage, cap in rows:
        assert strict_cap(int(concurrency), int(percentage)) == int(cap), (concurrency, percentage)


def test_rotation_example_is_the_code() -> None:
    from taskfleet.shared.policy.groups import SmoothWeightedRoundRobin, group_name

    text = section("scheduling")
    match = re.search(r"weights `\{a: 5, b: 1, default: 1\}` give\s+`([a-z ]+)`", text)
    assert match, "the rotation example is gone"
    rotation = SmoothWeightedRoundRobin({"a": 5, "b": 1, None: 1})
    picks = [group_name(rotation.pick()) for _ in range(7)]
    assert " ".join(picks) == match.group(1)


# --- links ----------------------------------------------------------------------------------------

#: Directories never scanned: tools' state, virtualenvs, caches.
_SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", "build", "dist"}


def repository_files() -> Iterator[Path]:
    """Every regular file of the working tree worth reading (no symlinks, no caches)."""
    stack = [REPO]
    while stack:
        directory = stack.pop()
        for path in sorted(directory.iterdir()):
            if path.is_symlink():
                continue
            if path.is_dir():
                hidden = path.name.startswith(".") and path.name not in {".ci", ".github"}
                if (
                    not hidden
                    and path.name not in _SKIPPED_DIRS
                    and not path.name.endswith(".egg-info")
                ):
                    stack.append(path)
            elif path.is_file():
                yield path


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DOC_REF = re.compile(r"(?<![\w/.])((?:docs/)?[\w.-]+\.md)#([\w-]+)")


def test_markdown_links_resolve() -> None:
    broken = []
    for path in repository_files():
        if path.suffix != ".md":
            continue
        text = text_of(path) or ""
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for target in _MD_LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{path.relative_to(REPO)}: {target} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_references_to_documents_resolve() -> None:
    """``docs/reference.md#scheduling`` written in a docstring or comment names a real anchor."""
    broken = []
    for path in repository_files():
        if path.suffix not in {".py", ".yml", ".yaml", ".toml", ".sh", ""}:
            continue
        text = text_of(path) or ""
        for document, anchor in _DOC_REF.findall(text):
            target = REPO / document
            if not target.exists():
                target = REPO / "docs" / document
            if not target.exists() or anchor not in anchors(target.read_text()):
                broken.append(f"{path.relative_to(REPO)}: {document}#{anchor}")
    assert not broken, "references to missing documents or anchors:\n" + "\n".join(broken)


# --- nothing points outside the repository --------------------------------------------------------

#: What a reference to the design documents kept beside the repository looks like. Built from
#: pieces so this file does not match itself.
OUTSIDE_REFERENCE = re.compile(
    "|".join(
        [
            r"\b" + "SP" + r"EC\b",  # its name: a section number, its file, "the ... formula"
            r"\.\./" + "shared",  # a relative path out of the checkout
            r"shared/" + "design",  # the design folder itself
            "ST" + r"YLE\.md",
            "ST" + r'YLE "',  # the style guide, quoted by section
        ]
    )
)


def test_no_file_refers_to_an_outside_specification() -> None:
    hits = []
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE_REFERENCE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not hits, (
        "link to the repository's own docs (docs/reference.md#...) instead:\n" + "\n".join(hits)
    )


def test_outside_reference_pattern_matches_what_it_must() -> None:
    for line in ('"""Lanes (' + "SP" + 'EC §4)."""', "see ../" + "shared/x", "ST" + "YLE.md"):
        assert OUTSIDE_REFERENCE.search(line), line
    for line in ("docs/reference.md#scheduling", "the specification of ASGI", "inspect.signature"):
        assert not OUTSIDE_REFERENCE.search(line), line
