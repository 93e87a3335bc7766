"""Claim planning: how many tasks one claim round trip asks of each lane and group
(docs/reference.md#scheduling).

The worker's single scheduler loop asks the planner for a plan, runs the one claim statement with
it, and reports back what it got. A lane or group that returned fewer tasks than asked is *dry*:
it is left out of later plans, so the free slots go to the others at once (work-conserving), until
something suggests new work (a wake-up notification, the poll interval, a sleep). The normal lane's
quotas come from the smooth weighted rotation over the groups that are not dry, so groups with work
share the capacity in proportion to their weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from taskfleet.shared.policy.groups import GroupKey, SmoothWeightedRoundRobin, group_for_labels
from taskfleet.shared.policy.lanes import Lane, lane_for_priority
from taskfleet.shared.policy.runtime_config import RuntimeConfig


@dataclass(frozen=True)
class ClaimPlan:
    """One claim round trip: per-lane limits and per-group quotas (``None`` = default group)."""

    control: int = 0
    strict: int = 0
    groups: tuple[tuple[GroupKey, int], ...] = ()
    #: Ask the database whether strict work is waiting (the strict cap is full).
    probe_strict: bool = False
    #: Ask whether normal-lane work is waiting (no slot went to the normal lane).
    probe_normal: bool = False
    #: The groups the rotation chose among (not dry): charging replays the picks among them.
    eligible: tuple[GroupKey, ...] = ()
    #: Ask the database why a lane or group came back short (contended or empty). False: the
    #: previous claim got all it asked, so this one most likely will too; a shortfall it meets
    #: is left unexplained (nothing is made dry) and the next claim asks again, with the probes.
    probes: bool = True

    @property
    def normal(self) -> int:
        return sum(n for _, n in self.groups)

    @property
    def total(self) -> int:
        return self.control + self.strict + self.normal

    @property
    def group_keys(self) -> list[GroupKey]:
        return [g for g, _ in self.groups]

    @property
    def group_limits(self) -> list[int]:
        return [n for _, n in self.groups]


@dataclass
class ClaimPlanner:
    """Lane order, strict cap and group shares for one worker. Pure state, no I/O."""

    concurrency: int
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    _rotation: SmoothWeightedRoundRobin = field(init=False)
    _configured: frozenset[str] = field(init=False)
    _configured_sorted: list[str] = field(init=False)
    _paused_labels: list[str] = field(init=False, default_factory=list)
    _paused_types: frozenset[str] = field(init=False, default=frozenset())
    _paused_lanes: frozenset[str] = field(init=False, default=frozenset())
    _paused_groups: frozenset[GroupKey] = field(init=False, default=frozenset())
    _dry_control: bool = field(init=False, default=False)
    _dry_strict: bool = field(init=False, default=False)
    _dry_groups: set[GroupKey] = field(init=False, default_factory=set)
    #: The last claim got everything it asked (the next may leave out the probes).
    _expect_full: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.apply(self.config)

    def apply(self, config: RuntimeConfig) -> None:
        """Swap in a new config: cap and rotation recomputed. Running tasks are not touched;
        a lower cap only stops new strict claims."""
        self.config = config
        self._rotation = SmoothWeightedRoundRobin(config.group_weights())
        self._configured = frozenset(config.label_weights)
        # Sorted once per config, not on every claim (it is a parameter of each claim).
        self._configured_sorted = sorted(self._configured)
        self._paused_labels = list(config.paused_labels)
        self._paused_types = frozenset(config.paused_types)
        self._paused_lanes = frozenset(config.paused_lanes)
        # A group whose key is a paused label holds only paused tasks (its key is one of each
        # task's labels): it gets no quota at all, at no cost.
        self._paused_groups = frozenset(
            g for g in self._rotation.groups if g in config.paused_labels
        )
        self.reset_dry()
        self._expect_full = False

    @property
    def strict_cap(self) -> int:
        return self.config.strict_cap(self.concurrency)

    @property
    def configured_labels(self) -> list[str]:
        return list(self._configured_sorted)

    @property
    def paused_labels(self) -> list[str]:
        """The claim's label filter: a task carrying any of them is not claimed."""
        return list(self._paused_labels)

    def claim_types(self, types: Iterable[str]) -> list[str]:
        """The types a claim may take: the worker's, less the paused ones (the config validation
        never lets the control lane's type be paused)."""
        return [t for t in types if t not in self._paused_types]

    def lane_paused(self, lane: Lane) -> bool:
        return lane.value in self._paused_lanes

    def reset_dry(self, lanes: Iterable[str] | None = None) -> None:
        """Something suggests new work: try the named lanes (default: all) and groups again."""
        names = None if lanes is None else frozenset(lanes)
        if names is None or Lane.CONTROL.value in names:
            self._dry_control = False
        if names is None or Lane.STRICT.value in names:
            self._dry_strict = False
        if names is None or Lane.NORMAL.value in names:
            self._dry_groups.clear()

    def control_possible(self) -> bool:
        return not self._dry_control

    def plan(self, *, free_slots: int, strict_inflight: int, control_free: bool) -> ClaimPlan:
        """The next claim for ``free_slots`` regular slots (and the control slot if free)."""
        control = 1 if control_free and not self._dry_control else 0
        free = max(0, free_slots)
        strict_paused = Lane.STRICT.value in self._paused_lanes
        strict_room = 0 if strict_paused else max(0, self.strict_cap - strict_inflight)
        strict = 0 if self._dry_strict else min(free, strict_room)
        # A paused lane is not asked, not even probed: its work waits by decision, which is
        # not saturation.
        probe = free > 0 and strict_room == 0 and not self._dry_strict and not strict_paused
        normal_slots = free - strict
        if Lane.NORMAL.value in self._paused_lanes:
            normal_slots = 0
        eligible = [
            g
            for g in self._rotation.groups
            if g not in self._dry_groups and g not in self._paused_groups
        ]
        groups: tuple[tuple[GroupKey, int], ...] = ()
        if normal_slots > 0 and eligible:
            # Asked, not charged: observe() charges the rotation for what the claim got.
            quotas = self._rotation.preview(normal_slots, eligible)
            groups = tuple((g, quotas[g]) for g in self._rotation.groups if g in quotas)
        probe_normal = (
            free > 0
            and not groups
            and bool(eligible)
            and Lane.NORMAL.value not in self._paused_lanes
        )
        # A claim that asks a lane whether it waits, or asks the control lane (claimed rarely,
        # after a wake-up), always probes; so does one after a claim that came back short.
        probes = not self._expect_full or bool(control) or probe or probe_normal
        return ClaimPlan(
            control=control,
            strict=strict,
            groups=groups,
            probe_strict=probe,
            probe_normal=probe_normal,
            eligible=tuple(eligible) if groups else (),
            probes=probes,
        )

    def observe(
        self,
        plan: ClaimPlan,
        claimed: Mapping[tuple[Lane, GroupKey], int],
        *,
        normal_waiting: bool | None = None,
        contended: Iterable[GroupKey] = (),
        strict_contended: bool = False,
        shortfall_trusted: bool = True,
    ) -> None:
        """Record what a claim returned.

        The rotation is charged for the normal-lane tasks each group got (not for what it was
        asked). Whatever came back short is *dry*, unless the database said the shortfall was
        contention (``contended`` groups, ``strict_contended``: ready rows existed that another
        worker held, so asking again soon may find more) or new work was announced meanwhile
        (``shortfall_trusted`` False). ``normal_waiting`` answers ``plan.probe_normal``: False
        makes the whole normal lane dry.
        """
        got = {g: claimed.get((Lane.NORMAL, g), 0) for g, _ in plan.groups}
        strict_short = claimed.get((Lane.STRICT, None), 0) < plan.strict
        short_groups = [g for g, asked in plan.groups if got[g] < asked]
        full = (
            claimed.get((Lane.CONTROL, None), 0) >= plan.control
            and not strict_short
            and not short_groups
        )
        self._expect_full = full and plan.total > 0
        if not plan.probes and not full:
            # Nobody asked why: each short group is charged as if contended (still owed what
            # it was asked), nothing is made dry, and the next claim asks with the probes.
            contended, strict_contended, shortfall_trusted = short_groups, strict_short, False
        busy = frozenset(contended)
        self._rotation.charge(
            got, asked=dict(plan.groups), eligible=plan.eligible or None, contended=busy
        )
        if not shortfall_trusted:
            return
        if plan.probe_normal and normal_waiting is False:
            self._dry_groups.update(self._rotation.groups)
        if plan.control and claimed.get((Lane.CONTROL, None), 0) < plan.control:
            self._dry_control = True
        if plan.strict and strict_short and not strict_contended:
            self._dry_strict = True
        for group, asked in plan.groups:
            if claimed.get((Lane.NORMAL, group), 0) < asked and group not in busy:
                self._dry_groups.add(group)

    def classify(
        self, priority: int, labels: list[str], group_key: str | None = None
    ) -> tuple[Lane, GroupKey]:
        """The lane and (normal lane only) group of a claimed task: its stored ``group_key``
        when the claim returned one ('' is the default group; it is the group whose quota the
        task was claimed under), else the rule applied to its labels."""
        lane = lane_for_priority(priority)
        if lane is not Lane.NORMAL:
            return lane, None
        if group_key is not None:
            return lane, group_key or None
        return lane, group_for_labels(labels, self._configured)
