"""Periodic tasks: when a schedule's slots fall. Pure code (no I/O); the clock is an argument.

A schedule is either a ``cron`` expression read in a time zone, or an ``every`` duration. The
cron arithmetic is the ``cronsim`` library's (it follows Debian cron at the daylight-saving
changes, see below); this module only parses the inputs, names the rules a bad one breaks, and
answers the two questions the firing asks:

- :func:`next_slot`: the first slot strictly after a time (the schedule's ``next_run_at``);
- :func:`fire_plan`: a schedule is due at ``due <= now``: which slot to run (the latest one at or
  before ``now``, so a fleet that was down over several slots runs once, not once per missed
  slot) and the slot after ``now`` it advances to.

Cron: 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading seconds field,
or one of the aliases ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/
``@midnight``, ``@hourly``. At a daylight-saving change, a 5-field expression at a fixed hour and
minute behaves as Debian cron does: a time skipped by the spring change runs right after the
gap (02:30 on the morning clocks jump 02:00 -> 03:00 runs at 03:00), a time repeated by the
autumn change runs once (the first time). Other expressions follow the real (UTC) clock.

Every: a duration of whole seconds, one or more ``<n><unit>`` parts with units ``s``, ``m``,
``h``, ``d`` (``30s``, ``5m``, ``1h30m``, ``1d``), at least 1 s and at most 366 days. Its slots
are the multiples of the duration since 1970-01-01 00:00 UTC (``every: 1h`` fires at the top of
each UTC hour, ``every: 1d`` at midnight UTC): the same instants for every worker and for every
re-declaration of the schedule. A time zone applies to cron only.
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from cronsim import CronSim, CronSimError

MAX_CRON_LENGTH = 200
MAX_TIMEZONE_LENGTH = 64
MAX_EVERY_LENGTH = 32
MAX_SCHEDULE_NAME_LENGTH = 200
MIN_EVERY_SECONDS = 1
MAX_EVERY_SECONDS = 366 * 24 * 3600
DEFAULT_TIMEZONE = "UTC"

CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"(?:[0-9]{1,9}[smhd])+")
_EVERY_PART = re.compile(r"([0-9]{1,9})([smhd])")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ScheduleError(ValueError):
    """A schedule input that breaks a rule; ``str()`` says which rule."""


def parse_every(text: str) -> int:
    """The duration ``text`` (``30s``, ``1h30m``) in seconds; :class:`ScheduleError` if bad."""
    if not _EVERY.fullmatch(text):
        raise ScheduleError(
            "must be a duration such as 30s, 5m, 1h30m or 1d (whole numbers with the units "
            "s, m, h, d)"
        )
    seconds = sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _EVERY_PART.findall(text))
    if not MIN_EVERY_SECONDS <= seconds <= MAX_EVERY_SECONDS:
        raise ScheduleError(f"must be between {MIN_EVERY_SECONDS}s and 366d")
    return seconds


def normalize_cron(text: str) -> str:
    """The expression as cronsim reads it (aliases expanded); :class:`ScheduleError` if bad."""
    expr = " ".join(text.split())
    expr = CRON_ALIASES.get(expr.lower(), expr)
    fields = expr.split(" ")
    if len(fields) not in (5, 6):
        raise ScheduleError(
            "must be a cron expression of 5 fields (minute hour day-of-month month "
            f"day-of-week), 6 with a leading seconds field, or an alias ({', '.join(CRON_ALIASES)})"
            f"; got {len(fields)} field(s)"
        )
    try:
        schedule = CronSim(expr, _EPOCH)
        next(schedule)
    except CronSimError as exc:
        raise ScheduleError(f"not a valid cron expression: {exc}") from None
    except StopIteration:
        raise ScheduleError("not a valid cron expression: it never matches") from None
    return expr


#: Names the system's zone files answer to that are not IANA zones: what they mean depends on
#: the machine (``localtime`` is its own setting), so the API and each worker could read them
#: differently, or a worker image not at all.
_HOST_ZONE_NAMES = frozenset({"localtime", "posixrules", "Factory"})
_HOST_ZONE_PREFIXES = ("posix/", "right/")


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name``; :class:`ScheduleError` if there is none of that name."""
    if name in _HOST_ZONE_NAMES or name.startswith(_HOST_ZONE_PREFIXES):
        raise ScheduleError(
            f"{name!r} depends on the machine it is read on; give an IANA time zone name "
            "(such as UTC, Europe/Berlin, America/New_York)"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            "not a known IANA time zone name (such as UTC, Europe/Berlin, America/New_York)"
        ) from None


def schedule_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a schedule's name (it is a URL path segment), or None: it
    must be 1-200 characters of storable text without a slash, a control character (C0, DEL or
    C1) or U+FFFD, and not "." or ".."."""
    if not 1 <= len(name) <= MAX_SCHEDULE_NAME_LENGTH:
        return f"must be 1 to {MAX_SCHEDULE_NAME_LENGTH} characters"
    if "\x00" in name:
        return "must not contain NUL characters"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "must not contain control characters"
    if "/" in name:
        return "must not contain a slash"
    if name in (".", ".."):
        # A path segment every HTTP client normalises away: the schedule could not be addressed.
        return 'must not be "." or ".."'
    if "\ufffd" in name:
        # What a URL's invalid UTF-8 (an encoded surrogate, say) decodes to.
        return "must be valid UTF-8 text (U+FFFD, the replacement character, is refused)"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text"
    return None


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: ``cron`` (in ``timezone``) or ``every`` (seconds)."""

    cron: str | None = None
    timezone: str = DEFAULT_TIMEZONE
    every: int | None = None

    @classmethod
    def parse(cls, *, cron: str | None, every: str | None, timezone: str | None) -> Timing:
        """From the stored or submitted text; :class:`ScheduleError` on the first broken rule."""
        if (cron is None) == (every is None):
            raise ScheduleError("give exactly one of cron or every")
        if every is not None:
            return cls(every=parse_every(every))
        assert cron is not None
        zone = timezone or DEFAULT_TIMEZONE
        parse_timezone(zone)
        return cls(cron=normalize_cron(cron), timezone=zone)

    def _zone(self) -> tzinfo:
        return UTC if self.timezone == DEFAULT_TIMEZONE else parse_timezone(self.timezone)


def next_slot(timing: Timing, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (an aware time), in UTC."""
    if after.tzinfo is None:
        raise ValueError("after must be an aware datetime")
    if timing.every is not None:
        elapsed = (after - _EPOCH) // timedelta(seconds=timing.every)
        return _EPOCH + timedelta(seconds=timing.every * (elapsed + 1))
    assert timing.cron is not None
    # cronsim can answer a time before ``after`` in the hour a clock change repeats (a fixed-time
    # job runs in the first pass only, and from inside the second pass it returns that first
    # one): skip to the first slot that is really later.
    slots = CronSim(timing.cron, after.astimezone(timing._zone()))
    while (slot := next(slots).astimezone(UTC)) <= after:
        pass
    return slot


def latest_slot(timing: Timing, at: datetime) -> datetime:
    """The last slot at or before ``at`` (an aware time), in UTC."""
    if at.tzinfo is None:
        raise ValueError("at must be an aware datetime")
    if timing.every is not None:
        elapsed = (at - _EPOCH) // timedelta(seconds=timing.every)
        return _EPOCH + timedelta(seconds=timing.every * elapsed)
    assert timing.cron is not None
    # Backwards from just after ``at`` (cronsim counts whole seconds), so ``at`` itself counts.
    start = (at + timedelta(seconds=1)).replace(microsecond=0)
    slots = CronSim(timing.cron, start.astimezone(timing._zone()), reverse=True)
    while (slot := next(slots).astimezone(UTC)) > at:  # as in next_slot, around a clock change
        pass
    return slot


@dataclass(frozen=True)
class FirePlan:
    #: The slot the task is enqueued for: the latest one at or before now.
    slot: datetime
    #: The schedule's next_run_at afterwards: the first slot after now.
    next_run_at: datetime
    #: Earlier missed slots folded into this one run, not run themselves (0 when on time;
    #: counted up to 1000).
    skipped: int


def fire_plan(timing: Timing, due: datetime, now: datetime) -> FirePlan | None:
    """What to do with a schedule whose ``next_run_at`` is ``due``, at ``now``; None if not due.

    One run however many slots were missed: the slot enqueued is the latest at or before
    ``now`` (never earlier than ``due``), and the schedule moves to the first slot after ``now``.
    """
    if due > now:
        return None
    following = next_slot(timing, now)
    slot = max(due, latest_slot(timing, now))
    skipped = 0
    if slot > due:
        # Count the folded slots only while cheap (a per-second schedule down for a day would
        # iterate 86,400 times): it is for a log line.
        probe = next_slot(timing, due)
        while probe < slot and skipped < 1000:
            skipped += 1
            probe = next_slot(timing, probe)
        skipped += 1
    return FirePlan(slot=slot, next_run_at=following, skipped=skipped)
