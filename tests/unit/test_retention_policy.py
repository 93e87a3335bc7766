"""Retention durations: what the settings accept, and the error that names the setting."""

from __future__ import annotations

import pytest

from taskfleet.cli.settings_errors import load_settings
from taskfleet.shared.errors import ConfigurationError
from taskfleet.shared.policy.retention import RetentionPolicy, format_retention, parse_retention
from taskfleet.shared.settings import WorkerSettings

URL = "postgresql://u@localhost/db"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2s", 2.0),
        ("15m", 900.0),
        ("24h", 86400.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        (" NEVER ", None),
        ("1.5s", 1.5),
    ],
)
def test_retention_durations(text: str, seconds: float | None) -> None:
    assert parse_retention(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "5", "-1h", "1w", "forever", "1 h", "s"])
def test_bad_retentions_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration such as 2s, 15m, 24h or 7d, or never"):
        parse_retention(text)


def test_format_retention() -> None:
    assert [format_retention(s) for s in (None, 86400.0, 604800.0, 90.0, 1.5)] == [
        "never",
        "1d",
        "7d",
        "90s",
        "1.5s",
    ]


def test_the_defaults_keep_a_day_and_failures_a_week() -> None:
    settings = WorkerSettings(database_url=URL)
    assert settings.retention == RetentionPolicy(
        completed=86400.0, cancelled=86400.0, failed=604800.0, workers=86400.0
    )
    assert settings.retention.task_cutoffs() == (
        ["completed", "failed", "cancelled"],
        [86400.0, 604800.0, 86400.0],
    )


def test_never_leaves_a_status_out_of_the_pruning() -> None:
    policy = WorkerSettings(database_url=URL, retention_failed="never").retention
    assert policy.task_cutoffs() == (["completed", "cancelled"], [86400.0, 86400.0])


def test_a_bad_retention_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKFLEET_RETENTION_FAILED", "1w")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(WorkerSettings, {"database_url": URL})
    assert "TASKFLEET_RETENTION_FAILED" in str(caught.value)
    assert "duration such as 2s, 15m, 24h or 7d, or never" in str(caught.value)
