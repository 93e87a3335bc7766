"""When a busy worker vacuums ``taskfleet.tasks`` itself (docs/architecture.md, "The claim
index's dead head").

A claim reads its lane's index from the head, in claim order, and the head is exactly where the
entries of the rows claimed since the table was last vacuumed lie: each claim and each finish
leaves the row's old version behind, and its index entries stay until a vacuum removes them.
The claim steps over them (about five pages per thousand), so without a vacuum the claim's cost
grows with every task claimed before it: a 1,000,000-task backlog drained at 6,400 tasks/s in
its first tenth and 1,750/s in its last. Autovacuum visits a database once a minute at best
(``autovacuum_naptime``) and waits for a fifth of the table to be dead; a draining fleet
claims hundreds of thousands of tasks in that time.

Pure: the decision from the table's statistics; the worker's vacuum loop does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Default of TASKFLEET_VACUUM_DEAD_ROWS.
DEFAULT_MIN_DEAD_ROWS = 10_000
#: ... and a vacuum waits for at least this share of the live rows to be dead: a vacuum reads
#: every index whole, so a larger table waits for more dead rows before it pays for one.
DEFAULT_DEAD_FRACTION = 0.05
#: Tasks this worker claims between two looks at the statistics (an idle worker never looks).
DEFAULT_CHECK_EVERY = 1_000


@dataclass(frozen=True)
class VacuumPolicy:
    """``min_dead_rows`` 0: never (the table is left to autovacuum)."""

    min_dead_rows: int = DEFAULT_MIN_DEAD_ROWS
    dead_fraction: float = DEFAULT_DEAD_FRACTION
    check_every: int = DEFAULT_CHECK_EVERY

    def __post_init__(self) -> None:
        if self.min_dead_rows < 0:
            raise ValueError("min_dead_rows must be 0 (off) or more")
        if not 0 <= self.dead_fraction <= 1:
            raise ValueError("dead_fraction must be between 0 and 1")
        if self.check_every < 1:
            raise ValueError("check_every must be at least 1")

    @property
    def enabled(self) -> bool:
        return self.min_dead_rows > 0

    def threshold(self, live: int) -> int:
        """Dead row versions at which a table of ``live`` rows is vacuumed."""
        return max(self.min_dead_rows, int(self.dead_fraction * max(live, 0)))

    def due(self, *, dead: int, live: int, vacuum_running: bool) -> bool:
        """Vacuum now? Never while another vacuum of the table runs (autovacuum's or another
        worker's): it removes the same rows."""
        if not self.enabled or vacuum_running:
            return False
        return dead >= self.threshold(live)
