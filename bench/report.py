"""Figures measured in repetitions: medians, ranges, paired ratios, and markdown tables."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Series:
    """One measured quantity of one system, one value per repetition (None: not measured)."""

    values: list[float | None] = field(default_factory=list)

    def add(self, value: float | None) -> None:
        self.values.append(value)

    @property
    def measured(self) -> list[float]:
        return [v for v in self.values if v is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.measured) if self.measured else None

    def cell(self, fmt: str = "{:,.0f}") -> str:
        if not self.measured:
            return "n/a"
        med = fmt.format(self.median)
        if len(self.measured) == 1:
            return med
        return f"{med} ({fmt.format(min(self.measured))}-{fmt.format(max(self.measured))})"


def paired_ratio(ours: Series, theirs: Series) -> Series:
    """ours/theirs per repetition (the two were measured next to each other)."""
    out = Series()
    for a, b in zip(ours.values, theirs.values, strict=False):
        out.add(a / b if a is not None and b not in (None, 0) else None)
    return out


def ratio_cell(ratio: Series) -> str:
    return ratio.cell("{:.2f}x") if ratio.measured else "n/a"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(round(p / 100 * len(ordered), 9))))
    return ordered[rank - 1]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rotated(items: Sequence[str], rep: int) -> list[str]:
    """The systems in a different order each repetition (A B C, B C A, ...), so drift over the
    run does not always favour the same position."""
    if not items:
        return []
    k = rep % len(items)
    return [*items[k:], *items[:k]]
