"""slicer(average_size, size_variation, delay): cut each chunk into pieces of
average_size ± size_variation bytes, `delay` microseconds apart."""

from __future__ import annotations

import random

import trio

from chaos.toxiproxy.toxics import Chunk, LinkControl, Send, Toxic, ToxicError


class Slicer(Toxic):
    kind = "slicer"
    defaults = {"average_size": 0, "size_variation": 0, "delay": 0}

    def check(self) -> None:
        if self.attributes["average_size"] <= 0:
            raise ToxicError("slicer: average_size must be > 0")
        if self.attributes["size_variation"] >= self.attributes["average_size"]:
            raise ToxicError("slicer: size_variation must be smaller than average_size")

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        average = self.attributes["average_size"]
        variation = self.attributes["size_variation"]
        data = chunk.data
        start = 0
        while start < len(data):
            size = average + (random.randint(-variation, variation) if variation else 0)
            await send(Chunk(data[start : start + size], chunk.arrived))
            start += size
            if start < len(data) and self.attributes["delay"]:
                await trio.sleep(self.attributes["delay"] / 1_000_000)
