"""A phase's ledger as an inline SVG timeline: one lane per event type, x by mono_ms.

Pure geometry: `layout(events)` returns the lanes, the marks and the axis ticks
with their coordinates; the report's template only draws them. Nothing is
fetched: the colours are fixed here, per family of event type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chaos.gameday.results import TimelineEvent

WIDTH = 880  # the drawing's width in SVG units
LABEL_W = 170  # room on the left for the lane names
LANE_H = 16
TOP = 8
AXIS_H = 22
MAX_MARKS = 2000  # beyond this a timeline shows the first MAX_MARKS events and says so

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
class Layout:
    width: int
    height: int
    lanes: tuple[Lane, ...]
    marks: tuple[Mark, ...]
    ticks: tuple[Tick, ...]
    shown: int
    total: int
    span_ms: float


def _ticks(span_ms: float) -> tuple[Tick, ...]:
    """About five round ticks across the span (1, 2 or 5 times a power of ten ms)."""
    if span_ms <= 0:
        return (Tick(LABEL_W, "0 ms"),)
    raw = span_ms / 5
    power = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    out, t = [], 0.0
    while t <= span_ms + 1e-9:
        label = f"{t / 1000:g} s" if step >= 1000 else f"{t:g} ms"
        out.append(Tick(LABEL_W + t / span_ms * (WIDTH - LABEL_W - 10), label))
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
    marks = tuple(
        Mark(
            x=round(LABEL_W + ((e.mono_ms - start) / span * plot_w if span > 0 else 0), 2),
            y=lane_y[e.type],
            colour=colour(e.type),
            title=f"seq {e.seq} · {e.mono_ms:g} ms · {e.type}"
            + (f" · {e.label}" if e.label else ""),
        )
        for e in shown
    )
    lanes = tuple(Lane(t, lane_y[t], colour(t), counts[t]) for t in types)
    height = TOP + len(types) * LANE_H + AXIS_H
    return Layout(WIDTH, height, lanes, marks, _ticks(span), len(shown), len(events), span)


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
