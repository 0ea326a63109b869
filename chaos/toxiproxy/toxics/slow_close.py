"""slow_close(delay): when the source closes, hold the close back `delay` ms."""

from __future__ import annotations

import trio

from chaos.toxiproxy.toxics import LinkControl, Toxic


class SlowClose(Toxic):
    kind = "slow_close"
    defaults = {"delay": 0}

    async def at_eof(self, link: LinkControl, state: dict) -> None:
        await trio.sleep(self.attributes["delay"] / 1000)
