"""bandwidth(rate): at most `rate` KB/s (1 KB = 1000 bytes, as Toxiproxy counts)."""

from __future__ import annotations

import trio

from chaos.toxiproxy.toxics import Chunk, LinkControl, Send, Toxic, ToxicError

SLICE_SECONDS = 0.1  # pace in 100 ms slices so a big chunk does not arrive as one burst


class Bandwidth(Toxic):
    kind = "bandwidth"
    defaults = {"rate": 0}

    def check(self) -> None:
        if self.attributes["rate"] <= 0:
            raise ToxicError("bandwidth: rate must be > 0 KB/s")

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        bytes_per_second = self.attributes["rate"] * 1000
        slice_bytes = max(1, int(bytes_per_second * SLICE_SECONDS))
        # A schedule kept across chunks: each byte's earliest departure time.
        due = max(state.get("due", 0.0), trio.current_time())
        data = chunk.data
        for start in range(0, len(data), slice_bytes):
            part = data[start : start + slice_bytes]
            due += len(part) / bytes_per_second
            await trio.sleep_until(due)
            await send(Chunk(part, chunk.arrived))
        state["due"] = due
