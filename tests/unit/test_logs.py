"""The log setup every process shares: JSON lines carry the fields a log call passes."""

from __future__ import annotations

import io
import json
import logging

import pytest

from taskfleet.shared.logs import JsonFormatter, configure_logging
from taskfleet.shared.settings import LoggingSettings


def _format(record_logger: logging.Logger, **kwargs: object) -> dict[str, object]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    record_logger.addHandler(handler)
    try:
        record_logger.warning("task %s failed", 7, **kwargs)  # type: ignore[arg-type]
    finally:
        record_logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    document: dict[str, object] = json.loads(lines[0])
    return document


def test_json_lines_carry_the_extra_fields() -> None:
    logger = logging.getLogger("taskfleet.test.json")
    document = _format(logger, extra={"task_id": 7, "type": "demo.fail", "attempt": 2})
    assert document["message"] == "task 7 failed"
    assert document["level"] == "WARNING"
    assert document["logger"] == "taskfleet.test.json"
    assert (document["task_id"], document["type"], document["attempt"]) == (7, "demo.fail", 2)
    assert str(document["time"]).endswith("+00:00")


def test_json_lines_hold_the_traceback_and_values_json_cannot() -> None:
    logger = logging.getLogger("taskfleet.test.json")
    try:
        raise ValueError("boom")
    except ValueError:
        document = _format(logger, exc_info=True, extra={"when": object})
    assert "ValueError: boom" in str(document["exception"])
    assert document["when"] == str(object)


def test_configure_logging_replaces_its_own_handler_only() -> None:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    others = [h for h in before if type(h).__name__ != "_TaskfleetHandler"]
    try:
        configure_logging("DEBUG", "json")
        configure_logging("WARNING", "text")
        ours = [h for h in root.handlers if h not in others]
        assert len(ours) == 1
        assert root.level == logging.WARNING
        assert all(h in root.handlers for h in others)
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
        for handler in before:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


def test_records_go_to_the_current_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """Not to the stream that was stderr at setup, which a test runner may have closed since."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        configure_logging("INFO", "json")
        logging.getLogger("taskfleet.test.stderr").info("hello", extra={"task_id": 3})
        record = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert (record["message"], record["task_id"]) == ("hello", 3)
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.parametrize("level", ["verbose", "trace", ""])
def test_an_unknown_log_level_is_refused(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKFLEET_LOG_LEVEL", level)
    with pytest.raises(ValueError, match="must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        LoggingSettings()


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKFLEET_LOG_LEVEL", "debug")
    monkeypatch.setenv("TASKFLEET_LOG_FORMAT", "json")
    settings = LoggingSettings()
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")
