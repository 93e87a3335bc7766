"""What makes a worker ready (services/worker/readiness.py) and a schema usable."""

from __future__ import annotations

from taskfleet.shared.migrations import schema_problem
from taskfleet.worker.readiness import ReadinessInputs, not_ready_reasons

READY = ReadinessInputs(
    status="running",
    connections_failing={"claim": False, "outcomes": False, "heartbeat": False},
    listen_enabled=True,
    listener_connected=True,
    schema_problem=None,
    claim_problem=None,
)


def test_ready_needs_every_part() -> None:
    assert not_ready_reasons(READY) == []
    cases = {
        "worker is draining": {"status": "draining"},
        "database connection 'claim' is failing": {
            "connections_failing": {"claim": True, "outcomes": False, "heartbeat": False}
        },
        "database connection 'outcomes' is failing": {
            "connections_failing": {"claim": False, "outcomes": True, "heartbeat": False}
        },
        "LISTEN connection is down": {"listener_connected": False},
        "the schema is wrong": {"schema_problem": "the schema is wrong"},
        "a claim is stuck": {"claim_problem": "a claim is stuck"},
    }
    for reason, change in cases.items():
        inputs = ReadinessInputs(**{**READY.__dict__, **change})
        assert not_ready_reasons(inputs) == [reason]
    # Listening off: no listener needed.
    off = ReadinessInputs(
        **{**READY.__dict__, "listen_enabled": False, "listener_connected": False}
    )
    assert not_ready_reasons(off) == []


def test_schema_problems_say_what_to_do() -> None:
    known = frozenset({"0001", "0002"})
    assert schema_problem(["0002"], head="0002", known=known) is None
    older = schema_problem(["0001"], head="0002", known=known)
    assert older is not None and "run taskfleet migrate" in older
    newer = schema_problem(["0099_future"], head="0002", known=known)
    assert newer is not None and "does not know" in newer and "upgrade this process" in newer
    empty = schema_problem([], head="0002", known=known)
    assert empty is not None and "not migrated" in empty
