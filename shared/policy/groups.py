"""Normal-lane groups and the smooth weighted round robin over them (docs/reference.md#rotation)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Name of the group of tasks that carry no configured label (metrics and logs show this).
DEFAULT_GROUP = "default"

#: A group key: a configured label, or ``None`` for the default group.
GroupKey = str | None


def group_for_labels(labels: Iterable[str], configured: Iterable[str]) -> GroupKey:
    """The one group a task belongs to.

    The lexicographically smallest (by code point, which is what SQL's ``COLLATE "C"`` uses) of
    the task's labels that are configured; ``None`` (the default group) when none is.
    """
    configured_set = configured if isinstance(configured, (set, frozenset)) else set(configured)
    matching = [label for label in labels if label in configured_set]
    return min(matching) if matching else None


def group_name(group: GroupKey) -> str:
    """The display name of a group (metrics label values, logs)."""
    return DEFAULT_GROUP if group is None else group


@dataclass
class SmoothWeightedRoundRobin:
    """Nginx-style smooth weighted round robin, restricted per pick to the groups that have work.

    Each pick adds every *eligible* group's weight to its running score, takes the group with the
    highest score and subtracts the eligible total from it. Ineligible groups keep their score, so
    the groups that do have work share picks in proportion to their weights, interleaved.
    Ties break by the order the groups were configured in (configured labels sorted, then default).
    """

    weights: Mapping[GroupKey, int]
    _order: tuple[GroupKey, ...] = field(init=False)
    _score: dict[GroupKey, int] = field(init=False)

    def __post_init__(self) -> None:
        for key, weight in self.weights.items():
            if weight < 1:
                raise ValueError(f"weight of group {group_name(key)!r} must be >= 1")
        labelled = sorted(k for k in self.weights if k is not None)
        self._order = (*labelled, None) if None in self.weights else tuple(labelled)
        self._score = dict.fromkeys(self._order, 0)

    @property
    def groups(self) -> tuple[GroupKey, ...]:
        return self._order

    def pick(self, eligible: Iterable[GroupKey] | None = None) -> GroupKey:
        """Choose the next group among ``eligible`` (all groups when ``None``)."""
        allowed = set(self._order) if eligible is None else set(eligible) & set(self._order)
        if not allowed:
            raise LookupError("no eligible group")
        total = 0
        best: GroupKey = None
        best_score: int | None = None
        for key in self._order:
            if key not in allowed:
                continue
            weight = self.weights[key]
            total += weight
            self._score[key] += weight
            if best_score is None or self._score[key] > best_score:
                best, best_score = key, self._score[key]
        self._score[best] -= total
        return best

    def take(self, n: int, eligible: Iterable[GroupKey] | None = None) -> dict[GroupKey, int]:
        """``n`` consecutive picks, counted per group (the quotas of one claim round trip)."""
        allowed = None if eligible is None else frozenset(eligible)
        quotas: dict[GroupKey, int] = {}
        for _ in range(n):
            key = self.pick(allowed)
            quotas[key] = quotas.get(key, 0) + 1
        return quotas

    def preview(self, n: int, eligible: Iterable[GroupKey] | None = None) -> dict[GroupKey, int]:
        """What :meth:`take` would return, without moving the rotation: a claim asks for these
        quotas, and :meth:`charge` then records what it really got."""
        saved = dict(self._score)
        try:
            return self.take(n, eligible)
        finally:
            self._score = saved

    def charge(
        self,
        got: Mapping[GroupKey, int],
        *,
        asked: Mapping[GroupKey, int] | None = None,
        eligible: Iterable[GroupKey] | None = None,
        contended: Iterable[GroupKey] = (),
    ) -> None:
        """Move the rotation by what a claim got, not by what it asked.

        The claim's picks are replayed, one per task it got, each going to the best-scored group
        that still has a task to account for. Every group the claim chose among (``eligible``)
        keeps earning its weight on each pick, except one that came back short with nothing
        more to give (found empty), which stops once its tasks are accounted for. A group that
        came back short only because another worker held its rows (``contended``) keeps
        earning, so it is owed the difference and asked for more next time. A claim that got
        all it asked moves the rotation exactly as :meth:`take` would.
        """
        left = {key: count for key, count in got.items() if count > 0 and key in self._score}
        wanted = asked if asked is not None else got
        busy = frozenset(contended)
        members = set(self._order) if eligible is None else set(eligible) & set(self._order)
        members |= set(left)
        # Short and not contended: earns only while it still has tasks to account for.
        fading = {k for k in members if got.get(k, 0) < wanted.get(k, 0) and k not in busy}
        while left:
            earning = [k for k in self._order if k in members and (k in left or k not in fading)]
            total = 0
            best: GroupKey = None
            best_score: int | None = None
            for key in earning:
                weight = self.weights[key]
                total += weight
                self._score[key] += weight
                if key in left and (best_score is None or self._score[key] > best_score):
                    best, best_score = key, self._score[key]
            self._score[best] -= total
            left[best] -= 1
            if left[best] == 0:
                del left[best]


def group_weights(label_weights: Mapping[str, int], default_weight: int) -> dict[GroupKey, int]:
    """The rotation's weights: every configured label plus the default group."""
    weights: dict[GroupKey, int] = {label: w for label, w in label_weights.items()}
    weights[None] = default_weight
    return weights
