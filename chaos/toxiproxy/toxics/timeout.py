"""timeout(timeout): no data passes; the connection closes after `timeout` ms.
With timeout 0 it is a black hole: held open, data dropped, until the toxic is
removed, which closes the connection (as Toxiproxy does)."""

from __future__ import annotations

import trio

from chaos.toxiproxy.toxics import Chunk, LinkControl, Send, Toxic


class Timeout(Toxic):
    kind = "timeout"
    defaults = {"timeout": 0}
    closes_on_removal = True

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        return None  # dropped: a timeout passes nothing

    async def watch(self, link: LinkControl) -> None:
        timeout_ms = self.attributes["timeout"]
        if timeout_ms:
            await trio.sleep(timeout_ms / 1000)
            link.close(f"timeout toxic: {timeout_ms} ms elapsed")
