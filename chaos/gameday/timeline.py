"""A phase's ledger as an inline SVG timeline: one lane per event type, x by mono_ms.

Pure geometry: `layout(events)` returns the lanes, the marks and the axis ticks
with their coordinates; the report's template only draws them. Nothing is
fetched: the colours are fixed here, per family of event type.

A clock fault can step the recorder's clock by half an hour between two events of
a four-second run; drawn to scale, every mark would be squeezed at one edge. So a
gap between two events that is over ten seconds and dwarfs the rest of the run
(see cut_gaps) is cut out of the axis and drawn as a marked break that says how
long it was: the jump stays visible, the run stays readable. Tick labels are the
real time since the first event, so the labels after a break show the jump too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.gameday.numbers import plain
from chaos.gameday.results import TimelineEvent

WIDTH = 880  # the drawing's width in SVG units
LABEL_W = 170  # room on the left for the lane names
LANE_H = 16
TOP = 8
AXIS_H = 22
MAX_MARKS = 2000  # beyond this a timeline shows the first MAX_MARKS events and says so
BREAK_MIN_MS = 10_000.0  # a shorter gap is never cut out of the axis (phases last seconds)
BREAK_RATIO = 5.0  # a cut gap is at least this many times all the uncut gaps together
BREAK_SHARE = 0.04  # a cut gap is drawn as this share of the axis

# Families of event types, coloured alike; the first prefix that matches wins.
COLOURS = (
    ("model.request", "#3b6fd4"),
    ("model.response", "#2e9e4f"),
    ("model.error", "#d43b3b"),
    ("policy.denied", "#e07b00"),
    ("cap.", "#e0a800"),
    ("breaker.", "#8a3bd4"),
    ("x-docket.breaker-open", "#b78ae6"),
    ("x-docket.rate-limited", "#9c6b30"),
    ("load.shed", "#6b4a1f"),
    ("fault.injected", "#d4237a"),
    ("evidence.gap", "#7a0000"),
    ("agent.backoff", "#178c8c"),
    ("net.", "#2aa3c9"),
    ("session.", "#555555"),
    ("process.", "#777777"),
    ("signal.", "#999999"),
)
OTHER = "#444444"


def colour(event_type: str) -> str:
    for prefix, value in COLOURS:
        if event_type.startswith(prefix):
            return value
    return OTHER


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    colour: str
    title: str  # the tooltip: seq, time, type and label


@dataclass(frozen=True)
class Lane:
    type: str
    y: float
    colour: str
    count: int


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Break:
    """A gap cut out of the axis: drawn from x to x + width, labelled with its length."""

    x: float
    width: float
    gap_ms: float
    label: str


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    lanes: tuple[Lane, ...]
    marks: tuple[Mark, ...]
    ticks: tuple[Tick, ...]
    shown: int
    total: int
    span_ms: float  # first to last event, jumps included
    breaks: tuple[Break, ...] = ()
    drawn_ms: float = 0.0  # the span without the cut gaps: what the axis shows to scale


def duration_text(ms: float) -> str:
    """`850 ms`, `12.5 s`, `30 min 3.6 s`: a length a reader takes in at once."""
    if ms < 1000:
        return f"{plain(ms)} ms"
    if ms < 60_000:
        return f"{plain(ms / 1000, 2)} s"
    minutes, rest = divmod(ms, 60_000)
    return f"{int(minutes)} min {plain(rest / 1000, 1)} s"


def cut_gaps(times: Sequence[float]) -> list[tuple[float, float]]:
    """The gaps (start, end) between consecutive distinct times that are cut out of the
    axis: the k largest, for the largest k whose smallest cut gap is over BREAK_MIN_MS and
    over BREAK_RATIO times all the uncut gaps together (a clock jump dwarfs the run; a
    quiet spell does not). At least one gap is always drawn to scale."""
    ordered = sorted(set(times))
    gaps = sorted(zip(ordered, ordered[1:], strict=False), key=lambda g: g[0] - g[1])
    lengths = [b - a for a, b in gaps]
    best = 0
    for k in range(1, len(gaps)):  # k < len(gaps): something stays to scale
        rest = sum(lengths[k:])
        if lengths[k - 1] > BREAK_MIN_MS and lengths[k - 1] > BREAK_RATIO * rest:
            best = k
    return sorted(gaps[:best])


def _ticks(segments: Sequence[tuple[float, float]], to_x, drawn_ms: float) -> tuple[Tick, ...]:
    """About five round ticks across the drawn span (1, 2 or 5 times a power of ten ms),
    inside each unbroken segment, labelled with the real time since the first event."""
    if drawn_ms <= 0:
        return (Tick(LABEL_W, "0 ms"),)
    raw = drawn_ms / 5
    power = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    out: list[Tick] = []
    for a, b in segments:
        t = math.ceil(a / step - 1e-9) * step
        while t <= b + 1e-9:
            label = f"{plain(t / 1000)} s" if step >= 1000 else f"{plain(t)} ms"
            out.append(Tick(round(to_x(t), 2), label))
            t += step
    return tuple(out)


def layout(events: Sequence[TimelineEvent]) -> Layout:
    shown = list(events[:MAX_MARKS])
    types: list[str] = []
    for e in shown:
        if e.type not in types:
            types.append(e.type)
    lane_y = {t: TOP + i * LANE_H for i, t in enumerate(types)}
    counts = {t: 0 for t in types}
    for e in shown:
        counts[e.type] += 1
    start = min((e.mono_ms for e in shown), default=0)
    span = max((e.mono_ms for e in shown), default=0) - start
    plot_w = WIDTH - LABEL_W - 10
    cuts = [(a - start, b - start) for a, b in cut_gaps([e.mono_ms for e in shown])]
    drawn = span - sum(b - a for a, b in cuts)
    gap_w = BREAK_SHARE * drawn if drawn > 0 else 1.0  # a break's width, in drawn ms
    scale_ms = drawn + gap_w * len(cuts)

    def to_x(t: float) -> float:
        """x of a time since the first event: the cut gaps before it replaced by gap_w."""
        shifted = t
        for a, b in cuts:
            if t >= b:
                shifted -= (b - a) - gap_w
            elif t > a:  # inside a cut gap: no event is, but keep the mapping total
                shifted -= t - a
        return LABEL_W + (shifted / scale_ms * plot_w if scale_ms > 0 else 0)

    marks = tuple(
        Mark(
            x=round(to_x(e.mono_ms - start), 2),
            y=lane_y[e.type],
            colour=colour(e.type),
            title=f"seq {e.seq} · {plain(e.mono_ms)} ms · {e.type}"
            + (f" · {e.label}" if e.label else ""),
        )
        for e in shown
    )
    breaks = tuple(
        Break(
            x=round(to_x(a), 2),
            width=round(to_x(b) - to_x(a), 2),
            gap_ms=b - a,
            label=f"+{duration_text(b - a)}",
        )
        for a, b in cuts
    )
    bounds = [0.0, *(t for cut in cuts for t in cut), span]
    segments = list(zip(bounds[::2], bounds[1::2], strict=True))
    lanes = tuple(Lane(t, lane_y[t], colour(t), counts[t]) for t in types)
    height = TOP + len(types) * LANE_H + AXIS_H
    return Layout(
        WIDTH,
        height,
        lanes,
        marks,
        _ticks(segments, to_x, drawn),
        len(shown),
        len(events),
        span,
        breaks,
        drawn,
    )


def label_for(event: dict) -> str:
    """A few words on an event for its tooltip: what makes this one different from its lane."""
    kind = event.get("type", "")
    if kind == "fault.injected":
        return str(event.get("fault", ""))
    if kind == "breaker.state":
        return f"{event.get('upstream')}: {event.get('from')} → {event.get('to')} ({event.get('reason')})"
    if kind == "model.error":
        return f"{event.get('provider')}: {event.get('reason')} {event.get('status') or ''}".strip()
    if kind in ("model.response", "model.request"):
        return f"{event.get('provider')} {event.get('call_id', '')}".strip()
    if kind in ("cap.warning", "cap.exceeded"):
        return f"{event.get('cap')}: {event.get('observed')} of {event.get('limit')}"
    if kind == "session.end":
        return f"{event.get('reason')} (exit {event.get('exit_status')})"
    if kind == "policy.denied":
        return str(event.get("reason", ""))
    return ""


def timeline_of(events: Sequence[dict]) -> tuple[TimelineEvent, ...]:
    """The timeline entries of a ledger's events (kept small: seq, time, type, label)."""
    return tuple(
        TimelineEvent(int(e.get("seq", i)), e.get("mono_ms", 0), str(e.get("type")), label_for(e))
        for i, e in enumerate(events)
        if isinstance(e.get("mono_ms", 0), int | float)
    )
