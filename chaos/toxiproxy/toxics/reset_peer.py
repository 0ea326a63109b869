"""reset_peer(timeout): on the first data, wait `timeout` ms, then reset the
connection (RST). The data itself is dropped."""

from __future__ import annotations

import trio

from chaos.toxiproxy.toxics import Chunk, LinkControl, Send, Toxic


class ResetPeer(Toxic):
    kind = "reset_peer"
    defaults = {"timeout": 0}

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        await trio.sleep_until(chunk.arrived + self.attributes["timeout"] / 1000)
        link.reset(f"reset_peer toxic after {self.attributes['timeout']} ms")
