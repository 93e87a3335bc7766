"""Where a worker's finished attempts are written: with its next claim, or at once on their own
(docs/architecture.md, "Outcomes: with the claim, or at once").

A worker's cycle is serial: one claim round trip, then the Python of the tasks it took, then the
next claim. Carried by the claim, the outcomes cost no statement of their own, but the server
writes them inside the claim's round trip, so the worker waits for them. Written at once, on the
outcome writer's own connection, they go out while the next claim runs, on a second server
process: the cycle is shorter by their write, and the database does one statement more per
cycle.

Which is better depends on whether the database has a core to spare. One worker keeps one
server process busy at most (its cycle is serial), so a lone worker's second statement runs on
an otherwise idle core: measured on two cores, one worker of 10 slots drained 10-33 % faster and
one of 100 slots 16-37 % faster. Several workers already keep several server processes busy, and
there the extra statement is CPU the fleet does not have: four workers of 10 drained 5-15 %
slower. So the outcomes go at once while no other worker is alive, and ride the claims as soon
as one is (what every worker did before). A fleet on a large database gives up the lone
worker's gain; it never pays the extra statements.

Pure: the decision from what the worker last heard of the fleet; the worker does the I/O.
"""

from __future__ import annotations


def outcomes_at_once(other_live_workers: int | None) -> bool:
    """Whether finished attempts are written at once instead of riding the next claim.
    ``other_live_workers``: how many other workers the database last said were alive (None:
    not known yet, e.g. before registering: the claims carry them, as in a fleet)."""
    if other_live_workers is None:
        return False
    if other_live_workers < 0:
        raise ValueError("other_live_workers must be 0 or more")
    return other_live_workers == 0
