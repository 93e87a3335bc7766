"""When a heartbeat renews a task's lease (docs/reference.md#worker-runtime).

A lease is renewed only once it has less than :func:`renewal_margin` left, not at every beat:
each renewal is a new row version of the task, and with a 30 s lease and a 3 s heartbeat a
long task was rewritten 20 times a minute. The margin keeps at least half the lease (plus one
heartbeat) in hand, so a worker still rides out half a lease of failed heartbeats (a database
blip) before anything it runs can expire; the renewal itself is a HOT update (no index holds
``lease_expires_at``), so it writes no index entry.
"""

from __future__ import annotations


def renewal_margin(lease_ttl: float, heartbeat_interval: float) -> float:
    """Seconds of lease left below which a heartbeat renews it: half the lease plus one beat,
    never more than the whole lease (then every beat renews, as a lease that short needs)."""
    return min(lease_ttl, lease_ttl / 2 + heartbeat_interval)


def renewals_per_minute(lease_ttl: float, heartbeat_interval: float) -> float:
    """About how often a running task's lease is rewritten (for the docs and the bench)."""
    margin = renewal_margin(lease_ttl, heartbeat_interval)
    # Renewed at the first beat with less than `margin` left: every (ttl - margin) seconds,
    # rounded up to whole beats.
    beats = max(1, -(-(lease_ttl - margin) // heartbeat_interval))
    return 60.0 / (beats * heartbeat_interval)
