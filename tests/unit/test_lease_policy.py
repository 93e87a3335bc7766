"""When a heartbeat renews a lease: half a lease plus one beat left, never more than the lease."""

from __future__ import annotations

import pytest

from taskfleet.shared.policy.leases import renewal_margin, renewals_per_minute


def test_the_renewal_margin_keeps_half_a_lease_in_hand() -> None:
    assert renewal_margin(30.0, 3.0) == 18.0
    assert renewals_per_minute(30.0, 3.0) == 60.0 / 12.0
    # A lease barely longer than two beats is renewed at every beat, as before.
    assert renewal_margin(1.0, 0.45) == 0.95
    assert renewals_per_minute(1.0, 0.45) == pytest.approx(60.0 / 0.45)
