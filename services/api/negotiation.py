"""Content negotiation of the runtime-config routes (docs/reference.md#http-api): which of
NDJSON, JSON Lines, SSE and one JSON document the ``Accept`` header prefers.
"""

from __future__ import annotations

from fastapi import status

from taskfleet.api.errors import ApiError, error_item

NDJSON = "application/x-ndjson"
JSONL = "application/jsonl"
SSE = "text/event-stream"
JSON = "application/json"
#: What a config request can answer with, in the server's order of preference.
OFFERED = (NDJSON, JSONL, SSE, JSON)


def _media_ranges(accept: str) -> list[tuple[str, str, float]]:
    ranges: list[tuple[str, str, float]] = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media, _, subtype = fields[0].lower().partition("/")
        if not media or not subtype:
            continue
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        ranges.append((media, subtype, q))
    return ranges


def negotiate(accept: str | None) -> str | None:
    """The offered media type the ``Accept`` header prefers, or None when it accepts none.

    Each offer takes the quality of the most specific range that matches it; ties go to the
    more specific match, then to the server's order (NDJSON first), so ``*/*`` means NDJSON.
    """
    if accept is None or not accept.strip():
        return NDJSON
    ranges = _media_ranges(accept)
    best: tuple[float, int, int] | None = None
    chosen: str | None = None
    for order, offer in enumerate(OFFERED):
        media, _, subtype = offer.partition("/")
        match: tuple[int, float] | None = None
        for r_media, r_subtype, q in ranges:
            if r_media == media and r_subtype == subtype:
                specificity = 2
            elif r_media == media and r_subtype == "*":
                specificity = 1
            elif r_media == "*" and r_subtype == "*":
                specificity = 0
            else:
                continue
            if match is None or specificity > match[0]:
                match = (specificity, q)
        if match is None or match[1] <= 0:
            continue
        rank = (match[1], match[0], -order)
        if best is None or rank > best:
            best, chosen = rank, offer
    return chosen


def not_acceptable() -> ApiError:
    return ApiError(
        status.HTTP_406_NOT_ACCEPTABLE,
        [
            error_item(
                ("header", "accept"),
                "must accept one of " + ", ".join(OFFERED) + " (or leave Accept out)",
                "not_acceptable",
            )
        ],
    )
