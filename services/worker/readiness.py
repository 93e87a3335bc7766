"""What ``/readyz`` says about a worker: ready, or the reasons it is not.

Ready means able to do its job now: running (not starting, draining or stopped), each of its
database connections working (the claim, the outcomes, the heartbeat), the LISTEN connection up
when listening is on, the schema at the revision this code was written for, and a claim loop
that is making progress (no claim statement stuck, no claim failing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ReadinessInputs:
    status: str
    #: connection name -> whether its last statement failed.
    connections_failing: Mapping[str, bool]
    listen_enabled: bool
    listener_connected: bool
    #: Why the schema is not usable (None when at the expected revision).
    schema_problem: str | None
    #: Why the claim loop is not making progress (None when it is).
    claim_problem: str | None


def not_ready_reasons(inputs: ReadinessInputs) -> list[str]:
    """Empty when ready; otherwise one line per reason."""
    reasons: list[str] = []
    if inputs.status != "running":
        reasons.append(f"worker is {inputs.status}")
    for name, failing in sorted(inputs.connections_failing.items()):
        if failing:
            reasons.append(f"database connection '{name}' is failing")
    if inputs.listen_enabled and not inputs.listener_connected:
        reasons.append("LISTEN connection is down")
    if inputs.schema_problem is not None:
        reasons.append(inputs.schema_problem)
    if inputs.claim_problem is not None:
        reasons.append(inputs.claim_problem)
    return reasons
