"""latency(latency, jitter): each chunk leaves latency ± jitter ms after it arrived."""

from __future__ import annotations

import random

import trio

from chaos.toxiproxy.toxics import Chunk, LinkControl, Send, Toxic


class Latency(Toxic):
    kind = "latency"
    defaults = {"latency": 0, "jitter": 0}

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        jitter = self.attributes["jitter"]
        delay_ms = self.attributes["latency"] + (random.uniform(-jitter, jitter) if jitter else 0)
        # From arrival, not from now: chunks queued behind this one are not delayed twice.
        await trio.sleep_until(chunk.arrived + max(delay_ms, 0) / 1000)
        await send(chunk)
