"""Faults on a replayed answer: what the replay upstream does with a harness's decision.

docket never imports the chaos harness (tests/test_layout.py). `docket chaos --replay`
(chaos/replay.py) decides, by seed, which of the fault grammar's upstream faults fire
on each request, records each as `fault.injected` (durable before its effect), and
hands the replay upstream a `Damage`: what to do to the recorded answer it serves.
The upstream performs it; this module says only what a Damage is.

An answer a fault replaced or broke (an error status, a cut, a truncated or malformed
body, usage left out) is not the recorded answer: it is marked `fault` (recorded
`replay_fault: true`, no `replayed_from`, costs zero) and the recorded call stays
unused, so the same request asked again (an SDK's retry after an injected 503) is
served the recorded answer. Delays alone leave the answer as recorded: it is served,
marked `replayed_from`, and used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from docket.replay.match import RecordedCall


@dataclass(frozen=True)
class Damage:
    first_byte_delay: float = 0.0  # seconds added before the first byte
    token_delay: float = 0.0  # seconds between a stream's events
    error: tuple[int, bytes] | None = None  # (status, JSON body) served instead
    retry_after: str | None = None  # with `error`
    body: str | None = None  # the recorded body rewritten (usage left out, JSON broken)
    cut_after_events: int | None = None  # a stream dropped after this many events
    truncate_bytes: int | None = None  # the answer dropped after this many bytes
    injected: tuple[dict, ...] = ()  # the fault.injected fields of what was performed

    @property
    def faithful(self) -> bool:
        """The recorded answer as recorded (at most delayed)."""
        return (
            self.error is None
            and self.body is None
            and self.cut_after_events is None
            and self.truncate_bytes is None
        )


# (call ordinal from 1, provider name, provider kind, the recorded call) -> its Damage,
# once every fault it performs is recorded.
AnswerFaults = Callable[[int, str, str, RecordedCall], Awaitable[Damage]]


def cut_events(events: list[bytes], damage: Damage) -> tuple[list[bytes], bool]:
    """A stream's events as the damage leaves them, and whether it cuts the stream: the
    first `cut_after_events` events; or the bytes up to `truncate_bytes`, the last event
    cut short (the stub's rules, chaos/stub/server.py)."""
    if damage.cut_after_events is not None and damage.cut_after_events < len(events):
        return events[: damage.cut_after_events], True
    limit = damage.truncate_bytes
    if limit is None:
        return events, False
    kept: list[bytes] = []
    sent = 0
    for event in events:
        if sent + len(event) >= limit:
            kept.append(event[: limit - sent])
            return kept, True
        kept.append(event)
        sent += len(event)
    return kept, False
