"""limit_data(bytes): the link passes exactly `bytes` bytes, then the connection closes."""

from __future__ import annotations

from chaos.toxiproxy.toxics import Chunk, LinkControl, Send, Toxic


class LimitData(Toxic):
    kind = "limit_data"
    defaults = {"bytes": 0}

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        passed = state.get("passed", 0)
        room = self.attributes["bytes"] - passed
        if room > 0:
            part = chunk.data[:room]
            state["passed"] = passed + len(part)
            await send(Chunk(part, chunk.arrived))
        if state.get("passed", 0) >= self.attributes["bytes"]:
            link.close(f"limit_data toxic: {self.attributes['bytes']} bytes passed")
