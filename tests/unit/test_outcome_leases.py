"""An outcome on its way to the database keeps its task's lease (``OutcomeWriter.held``): the
heartbeat reports as held every task whose outcome is queued *or in a statement in flight*. A
sweep that ran while a claim carried an outcome (taken from the queue, not yet written) found a
task that ran longer than its lease, that no one held, and failed it for an expired lease."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.worker.database import Database
from taskfleet.worker.outcomes import RELEASED, Outcome, OutcomeWriter


def _writer() -> OutcomeWriter:
    # Never connected: these steps do not touch the database.
    return OutcomeWriter(
        Database("postgresql://unused/unused", "test"),
        "w1",
        WorkerMetrics.create(CollectorRegistry()),
        on_retry_written=lambda: None,
    )


def test_an_outcome_a_claim_carries_is_held_until_the_claim_returns() -> None:
    writer = _writer()
    writer.put(Outcome(7, 2, "failed", type="kit.child", error="timed out after 10s"))
    writer.put(Outcome(8, 1, RELEASED, type="kit.child"))
    taken = writer.take_for_claim()
    assert [(o.id, o.attempt) for o in taken] == [(7, 2)]
    assert len(writer) == 1  # only the release is still queued
    assert sorted(writer.held()) == [(7, 2), (8, 1)]
    assert writer.busy
    writer.settled(taken)
    assert writer.held() == [(8, 1)]


def test_an_outcome_put_back_after_a_failed_claim_is_held_once() -> None:
    writer = _writer()
    writer.put(Outcome(7, 1, "completed", type="demo.echo"))
    taken = writer.take_for_claim()
    writer.put_back(taken)
    assert writer.held() == [(7, 1)]
    assert writer.take_for_claim() == taken
