"""Numbers as a report prints them: never in exponent form, and percentiles that say
what they mean over few calls. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Mapping

# (label, key, the fewest calls for which this percentile is not simply the slowest call
# under nearest rank: rank ceil(p/100 * n) < n needs n > 100 / (100 - p))
PERCENTILES = (
    ("p50", "p50_ms", 2),
    ("p95", "p95_ms", 21),
    ("p99", "p99_ms", 101),
    ("p99.9", "p999_ms", 1001),
)


def plain(value: object, decimals: int = 3) -> str:
    """A number in positional notation, trailing zeros trimmed: 1803650, 0.25, 12.5 (never
    1.80365e+06, as `%g` prints it). Not a number: its str()."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def latency_text(summary: Mapping | None) -> str:
    """`p50 12 ms · p95 30 ms · max 41 ms over 40 calls`, naming the percentiles that are
    only the slowest call over this few calls instead of printing them as if measured."""
    count = summary.get("count") if summary is not None else None
    if summary is None or not count:
        return "no calls closed"
    calls = "1 call" if count == 1 else f"{count} calls"
    shown = [
        f"{label} {plain(summary.get(key))} ms"
        for label, key, fewest in PERCENTILES
        if count >= fewest and summary.get(key) is not None
    ]
    missing = count < PERCENTILES[-1][2]
    text = " · ".join([*shown, f"max {plain(summary.get('max_ms'))} ms"]) + f" over {calls}"
    if missing:
        need = ", ".join(
            f"{label} over {fewest - 1}" for label, _key, fewest in PERCENTILES if count < fewest
        )
        text += (
            f" (not shown: {need} calls are needed; with fewer, nearest rank gives the "
            "slowest call)"
        )
    return text
