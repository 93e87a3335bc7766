"""Runtime config: validation and normalisation of the wire parameters
(docs/reference.md#parameters).

The API validates a request before enqueueing it, the update task validates it again, and every
worker applies the normalised form. All three call :func:`normalise_runtime_config`.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from taskfleet.shared.policy.groups import DEFAULT_GROUP, GroupKey, group_weights
from taskfleet.shared.policy.lanes import CONTROL_LANE_NAME, RUNTIME_CONFIG_TASK_TYPE, strict_cap
from taskfleet.shared.storable import escape_text, text_problem

KNOWN_FIELDS = frozenset(
    {
        "maxStrictPercentage",
        "defaultWeight",
        "labels",
        "weights",
        "labelWeights",
        "requestID",
        "notifyInterval",
        "listenTimeout",
        "pausedLabels",
        "pausedTypes",
        "pausedLanes",
        "labelLimits",
    }
)
MAX_LABELS = 1000
MAX_LABEL_LENGTH = 128
MAX_REQUEST_ID_LENGTH = 200
DEFAULT_NOTIFY_INTERVAL = 1.0
DEFAULT_LISTEN_TIMEOUT = 2.0
#: Every claim locks each active limit row: the number of limits is what a claim pays for them.
MAX_LABEL_LIMITS = 100
MAX_PAUSED = 1000
MAX_TYPE_LENGTH = 200
MAX_RATE_PER_SECOND = 1_000_000.0
#: One token in about 11.6 days. Smaller rates overflowed the claim's arithmetic (the seconds to
#: the next token, 1 / rate, in float8): every claim failed, the config task's too, so not even a
#: new config could undo it. The claim also reads any stored rate as at least this (queries.py).
MIN_RATE_PER_SECOND = 0.000001
#: The lanes that can be paused; the control lane (the config task itself) never can.
PAUSABLE_LANES = ("normal", "strict")


@dataclass(frozen=True)
class ConfigIssue:
    """One broken rule: the wire field (a path) and what the rule is."""

    loc: tuple[str | int, ...]
    msg: str


class RuntimeConfigError(ValueError):
    """Raised with every broken rule of a runtime-config request."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(f"{'.'.join(map(str, i.loc))}: {i.msg}" for i in issues))


@dataclass(frozen=True)
class LabelLimit:
    """A fleet-wide limit on the tasks carrying one label (None: no such limit)."""

    max_in_flight: int | None = None
    rate_per_second: float | None = None

    def to_payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_in_flight is not None:
            out["maxInFlight"] = self.max_in_flight
        if self.rate_per_second is not None:
            out["ratePerSecond"] = self.rate_per_second
        return out


@dataclass(frozen=True)
class RuntimeConfig:
    """A normalised runtime config, as stored in ``worker_runtime_configs.payload``."""

    max_strict_percentage: int = 100
    default_weight: int = 1
    label_weights: Mapping[str, int] = field(default_factory=dict)
    notify_interval: float = DEFAULT_NOTIFY_INTERVAL
    listen_timeout: float = DEFAULT_LISTEN_TIMEOUT
    request_id: str = ""
    #: Paused: tasks carrying any of these labels, of these types, or in these lanes stay
    #: pending (sorted, no duplicates).
    paused_labels: tuple[str, ...] = ()
    paused_types: tuple[str, ...] = ()
    paused_lanes: tuple[str, ...] = ()
    label_limits: Mapping[str, LabelLimit] = field(default_factory=dict)

    def strict_cap(self, concurrency: int) -> int:
        return strict_cap(concurrency, self.max_strict_percentage)

    def group_weights(self) -> dict[GroupKey, int]:
        return group_weights(self.label_weights, self.default_weight)

    def to_payload(self) -> dict[str, Any]:
        """The canonical stored form (wire names; labels sorted so equal configs compare equal)."""
        return {
            "maxStrictPercentage": self.max_strict_percentage,
            "defaultWeight": self.default_weight,
            "labelWeights": dict(sorted(self.label_weights.items())),
            "notifyInterval": format_duration(self.notify_interval),
            "listenTimeout": format_duration(self.listen_timeout),
            "requestID": self.request_id,
            "pausedLabels": list(self.paused_labels),
            "pausedTypes": list(self.paused_types),
            "pausedLanes": list(self.paused_lanes),
            "labelLimits": {
                label: limit.to_payload() for label, limit in sorted(self.label_limits.items())
            },
        }


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(value: object) -> float:
    """Seconds from a Go-style duration (``"1s"``, ``"250ms"``, ``"1m30s"``) or a number of
    seconds. Raises ``ValueError`` with the rule when it is not one."""
    if isinstance(value, bool):
        raise ValueError('must be a duration such as "1s" or "500ms"')
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError('must be a duration such as "1s" or "500ms"')
        pos = 0
        seconds = 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            raise ValueError('must be a duration such as "1s" or "500ms"')
    else:
        raise ValueError('must be a duration such as "1s" or "500ms"')
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be greater than 0")
    if round(seconds * 1_000_000_000) < 1:
        # Kept to the nanosecond (format_duration): less would be stored as "0s", which these
        # same rules refuse when the version is read back.
        raise ValueError("must be at least 1ns")
    if seconds > 3600:
        raise ValueError("must be at most 1h")
    return seconds


def format_duration(seconds: float) -> str:
    """An exact Go-style rendering (to the nanosecond) in the largest unit that divides it."""
    nanos = round(seconds * 1_000_000_000)
    for unit, size in (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if nanos % size == 0:
            return f"{nanos // size}{unit}"
    return f"{nanos}ns"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_name(
    value: object, what: str, max_length: int, loc: tuple[str | int, ...], issues: list[ConfigIssue]
) -> bool:
    """A non-empty string of storable text of at most ``max_length`` characters (``what`` names
    it in the message: "label", "task type")."""
    if not isinstance(value, str) or not value.strip():
        issues.append(ConfigIssue(loc, f"{what} must be a non-empty string"))
        return False
    if len(value) > max_length:
        issues.append(ConfigIssue(loc, f"{what} must be at most {max_length} characters"))
        return False
    if (problem := text_problem(value)) is not None:
        issues.append(ConfigIssue(loc, f"{what} must not contain {problem}"))
        return False
    return True


def _check_label(value: object, loc: tuple[str | int, ...], issues: list[ConfigIssue]) -> bool:
    return _check_name(value, "label", MAX_LABEL_LENGTH, loc, issues)


def _check_weighted_label(
    value: object, loc: tuple[str | int, ...], issues: list[ConfigIssue]
) -> bool:
    """A label that gets a weight (its own group): any label but the default group's name, which
    would make two groups of one name in the stats and the metrics."""
    if not _check_label(value, loc, issues):
        return False
    if value == DEFAULT_GROUP:
        issues.append(
            ConfigIssue(
                loc,
                f"'{DEFAULT_GROUP}' names the group of tasks with no weighted label (its weight "
                "is defaultWeight); weight another label",
            )
        )
        return False
    return True


def _check_weight(value: object, loc: tuple[str | int, ...], issues: list[ConfigIssue]) -> bool:
    if not _is_int(value) or int(value) < 1:  # type: ignore[call-overload]
        issues.append(ConfigIssue(loc, "weight must be an integer >= 1"))
        return False
    if int(value) > 1_000_000:  # type: ignore[call-overload]
        issues.append(ConfigIssue(loc, "weight must be at most 1000000"))
        return False
    return True


def _check_list(value: object, wire: str, issues: list[ConfigIssue]) -> list[Any] | None:
    if not isinstance(value, list):
        issues.append(ConfigIssue((wire,), "must be a list"))
        return None
    if len(value) > MAX_PAUSED:
        issues.append(ConfigIssue((wire,), f"at most {MAX_PAUSED} entries"))
        return None
    return value


def _check_type(value: object, loc: tuple[str | int, ...], issues: list[ConfigIssue]) -> bool:
    if not _check_name(value, "task type", MAX_TYPE_LENGTH, loc, issues):
        return False
    if value == RUNTIME_CONFIG_TASK_TYPE:
        issues.append(
            ConfigIssue(
                loc,
                f"{RUNTIME_CONFIG_TASK_TYPE} is the control lane's task: it can never be paused",
            )
        )
        return False
    return True


def _check_lane(value: object, loc: tuple[str | int, ...], issues: list[ConfigIssue]) -> bool:
    if value == CONTROL_LANE_NAME:
        issues.append(ConfigIssue(loc, "the control lane can never be paused"))
        return False
    if value not in PAUSABLE_LANES:
        issues.append(ConfigIssue(loc, f"must be one of {', '.join(PAUSABLE_LANES)}"))
        return False
    return True


def _check_label_limits(value: object, issues: list[ConfigIssue]) -> dict[str, LabelLimit] | None:
    if not isinstance(value, Mapping):
        issues.append(
            ConfigIssue(("labelLimits",), "must be an object label -> {maxInFlight, ratePerSecond}")
        )
        return None
    if len(value) > MAX_LABEL_LIMITS:
        issues.append(ConfigIssue(("labelLimits",), f"at most {MAX_LABEL_LIMITS} labels"))
        return None
    limits: dict[str, LabelLimit] = {}
    for label, spec in value.items():
        loc: tuple[str | int, ...] = ("labelLimits", escape_text(str(label)))
        if not _check_label(label, loc, issues):
            continue
        if not isinstance(spec, Mapping):
            issues.append(
                ConfigIssue(loc, "must be an object with maxInFlight and/or ratePerSecond")
            )
            continue
        unknown = [k for k in spec if k not in ("maxInFlight", "ratePerSecond")]
        for key in unknown:
            issues.append(ConfigIssue((*loc, escape_text(str(key))), "unknown field"))
        max_in_flight = spec.get("maxInFlight")
        rate = spec.get("ratePerSecond")
        ok = not unknown
        if max_in_flight is not None and (
            not _is_int(max_in_flight) or not 1 <= max_in_flight <= 1_000_000
        ):
            issues.append(ConfigIssue((*loc, "maxInFlight"), "must be an integer in [1, 1000000]"))
            ok = False
        if rate is not None and (
            isinstance(rate, bool)
            or not isinstance(rate, (int, float))
            or not math.isfinite(rate)
            or not MIN_RATE_PER_SECOND <= rate <= MAX_RATE_PER_SECOND
        ):
            issues.append(
                ConfigIssue(
                    (*loc, "ratePerSecond"),
                    f"must be a number from {MIN_RATE_PER_SECOND:f} (one start in about "
                    f"11.6 days) to {MAX_RATE_PER_SECOND:.0f}",
                )
            )
            ok = False
        if max_in_flight is None and rate is None:
            issues.append(ConfigIssue(loc, "give maxInFlight, ratePerSecond or both"))
            ok = False
        if ok:
            limits[label] = LabelLimit(
                max_in_flight=max_in_flight,
                rate_per_second=float(rate) if rate is not None else None,
            )
    return limits


def normalise_runtime_config(
    params: Mapping[str, Any],
    *,
    default_max_strict_percentage: int = 100,
    base: RuntimeConfig | None = None,
    generate_request_id: bool = True,
) -> RuntimeConfig:
    """Validate wire parameters and return the normalised config.

    ``base`` is the latest config for a PATCH (fields not given keep its values); ``None`` is a
    PUT, where an omitted field takes its fleet default. Raises :class:`RuntimeConfigError` that
    lists every broken rule by field.
    """
    issues: list[ConfigIssue] = []
    if not isinstance(params, Mapping):
        raise RuntimeConfigError([ConfigIssue((), "body must be a JSON object")])
    for key in params:
        if key not in KNOWN_FIELDS:
            issues.append(ConfigIssue((str(key),), "unknown field"))
        elif params[key] is None:
            issues.append(ConfigIssue((key,), "must not be null: omit the field instead"))

    if base is None:
        pct = default_max_strict_percentage
        default_weight = 1
        label_weights: dict[str, int] = {}
        notify_interval = DEFAULT_NOTIFY_INTERVAL
        listen_timeout = DEFAULT_LISTEN_TIMEOUT
    else:
        pct = base.max_strict_percentage
        default_weight = base.default_weight
        label_weights = dict(base.label_weights)
        notify_interval = base.notify_interval
        listen_timeout = base.listen_timeout

    if params.get("maxStrictPercentage") is not None:
        value = params["maxStrictPercentage"]
        if not _is_int(value) or not 0 <= value <= 100:
            issues.append(ConfigIssue(("maxStrictPercentage",), "must be an integer in [0, 100]"))
        else:
            pct = value

    if params.get("defaultWeight") is not None and _check_weight(
        params["defaultWeight"], ("defaultWeight",), issues
    ):
        default_weight = params["defaultWeight"]

    has_pair = params.get("labels") is not None or params.get("weights") is not None
    has_map = params.get("labelWeights") is not None
    if has_pair and has_map:
        issues.append(
            ConfigIssue(("labelWeights",), "must not be given together with labels/weights")
        )
    elif has_pair:
        labels, weights = params.get("labels"), params.get("weights")
        if not isinstance(labels, list):
            issues.append(ConfigIssue(("labels",), "must be a list of labels given with weights"))
        if not isinstance(weights, list):
            issues.append(ConfigIssue(("weights",), "must be a list of weights given with labels"))
        if isinstance(labels, list) and isinstance(weights, list):
            if len(labels) != len(weights):
                issues.append(
                    ConfigIssue(("weights",), "labels and weights must have equal lengths")
                )
            elif len(labels) > MAX_LABELS:
                issues.append(ConfigIssue(("labels",), f"at most {MAX_LABELS} labels"))
            else:
                new_map: dict[str, int] = {}
                for i, (label, weight) in enumerate(zip(labels, weights, strict=True)):
                    ok_label = _check_weighted_label(label, ("labels", i), issues)
                    ok_weight = _check_weight(weight, ("weights", i), issues)
                    if ok_label and ok_weight:
                        new_map[label] = weight  # a duplicate label: last wins
                label_weights = new_map
    elif has_map:
        mapping = params["labelWeights"]
        if not isinstance(mapping, Mapping):
            issues.append(ConfigIssue(("labelWeights",), "must be an object label -> weight"))
        elif len(mapping) > MAX_LABELS:
            issues.append(ConfigIssue(("labelWeights",), f"at most {MAX_LABELS} labels"))
        else:
            new_map = {}
            for label, weight in mapping.items():
                ok_label = _check_weighted_label(
                    label, ("labelWeights", escape_text(str(label))), issues
                )
                ok_weight = _check_weight(weight, ("labelWeights", escape_text(str(label))), issues)
                if ok_label and ok_weight:
                    new_map[label] = weight
            label_weights = new_map

    for wire, attr in (("notifyInterval", "notify"), ("listenTimeout", "listen")):
        if params.get(wire) is None:
            continue
        try:
            seconds = parse_duration(params[wire])
        except ValueError as exc:
            issues.append(ConfigIssue((wire,), str(exc)))
            continue
        if attr == "notify":
            notify_interval = seconds
        else:
            listen_timeout = seconds

    paused_labels = list(base.paused_labels) if base is not None else []
    paused_types = list(base.paused_types) if base is not None else []
    paused_lanes = list(base.paused_lanes) if base is not None else []
    label_limits = dict(base.label_limits) if base is not None else {}
    if params.get("pausedLabels") is not None:
        checked = _check_list(params["pausedLabels"], "pausedLabels", issues)
        if checked is not None:
            paused_labels = [
                v for i, v in enumerate(checked) if _check_label(v, ("pausedLabels", i), issues)
            ]
    if params.get("pausedTypes") is not None:
        checked = _check_list(params["pausedTypes"], "pausedTypes", issues)
        if checked is not None:
            paused_types = [
                v for i, v in enumerate(checked) if _check_type(v, ("pausedTypes", i), issues)
            ]
    if params.get("pausedLanes") is not None:
        checked = _check_list(params["pausedLanes"], "pausedLanes", issues)
        if checked is not None:
            paused_lanes = [
                v for i, v in enumerate(checked) if _check_lane(v, ("pausedLanes", i), issues)
            ]
    if params.get("labelLimits") is not None:
        checked_limits = _check_label_limits(params["labelLimits"], issues)
        if checked_limits is not None:
            label_limits = checked_limits

    request_id = params.get("requestID")
    if request_id is not None and (
        not isinstance(request_id, str)
        or not request_id.strip()
        or len(request_id) > MAX_REQUEST_ID_LENGTH
    ):
        issues.append(
            ConfigIssue(
                ("requestID",),
                f"must be a non-empty string of at most {MAX_REQUEST_ID_LENGTH} characters",
            )
        )
        request_id = None
    elif isinstance(request_id, str) and (problem := text_problem(request_id)) is not None:
        issues.append(ConfigIssue(("requestID",), f"must not contain {problem}"))
        request_id = None

    if issues:
        raise RuntimeConfigError(issues)
    if request_id is None:
        request_id = str(uuid.uuid4()) if generate_request_id else ""
    return RuntimeConfig(
        max_strict_percentage=pct,
        default_weight=default_weight,
        label_weights=dict(sorted(label_weights.items())),
        notify_interval=notify_interval,
        listen_timeout=listen_timeout,
        request_id=request_id,
        paused_labels=tuple(sorted(set(paused_labels))),
        paused_types=tuple(sorted(set(paused_types))),
        paused_lanes=tuple(sorted(set(paused_lanes))),
        label_limits=dict(sorted(label_limits.items())),
    )


#: The key of a PATCH's changes in the update task's payload (a PUT's payload is the config).
PATCH_KEY = "patch"


def patch_payload(request_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """The update task's payload for a PATCH: the changes as given, merged into the latest
    version by the writer, in the transaction that inserts the new one (so concurrent PATCHes
    compose: none merges against a version another one is replacing)."""
    return {
        "requestID": request_id,
        PATCH_KEY: {k: v for k, v in changes.items() if k != "requestID"},
    }


def resolve_update(
    payload: Mapping[str, Any],
    *,
    latest: Mapping[str, Any] | None,
    default_max_strict_percentage: int = 100,
) -> RuntimeConfig:
    """The config an update task writes, validated: a PUT's config as given (omitted fields at
    their defaults); a PATCH's changes merged into ``latest``, the newest stored payload (None
    before the first version, when the defaults are the base). Raises RuntimeConfigError."""
    if not isinstance(payload, Mapping):
        raise RuntimeConfigError([ConfigIssue((), "body must be a JSON object")])
    if PATCH_KEY not in payload:
        return normalise_runtime_config(
            payload,
            default_max_strict_percentage=default_max_strict_percentage,
            generate_request_id=False,
        )
    changes = payload[PATCH_KEY]
    if not isinstance(changes, Mapping):
        raise RuntimeConfigError([ConfigIssue((PATCH_KEY,), "must be an object of changes")])
    return normalise_runtime_config(
        {**changes, "requestID": payload.get("requestID")},
        default_max_strict_percentage=default_max_strict_percentage,
        base=config_from_payload(latest) if latest is not None else None,
        generate_request_id=False,
    )


def config_from_payload(payload: Mapping[str, Any]) -> RuntimeConfig:
    """Read a stored (already normalised) payload back. Tolerant: a stored row is trusted."""
    known = {k: v for k, v in payload.items() if k in KNOWN_FIELDS}
    if not known.get("requestID"):
        known.pop("requestID", None)  # the built-in default config has no request id
    return normalise_runtime_config(known, generate_request_id=False)
