"""The fault table: every target the grammar knows, its kinds and their arguments.

The grammar refuses any fault this table does not declare, so a fault its
layer cannot perform is caught before the run (chaos.faults says what a
family declares).
"""

from __future__ import annotations

from chaos.faults import FamilySpec, KindSpec, Param
from chaos.faults.values import Duration

_STREAM = Param("stream", ("choice",), default="downstream", choices=("upstream", "downstream"))
_WHO = Param("who", ("choice",), required=True, positional=True, choices=("supervisor", "agent"))
_RETRY_AFTER = Param("retry_after", ("duration", "http_date"))


def _dur(name: str, **kw) -> Param:
    return Param(name, ("duration",), **kw)


FAMILIES: dict[str, FamilySpec] = {
    "upstream": FamilySpec(
        "upstream",
        {
            "status": KindSpec(
                (
                    Param(
                        "code", ("int",), required=True, positional=True, minimum=400, maximum=599
                    ),
                    _RETRY_AFTER,
                )
            ),
            "rate_limited": KindSpec((_RETRY_AFTER,)),
            "overloaded": KindSpec((_RETRY_AFTER,)),
            "malformed_json": KindSpec(),
            "truncate": KindSpec((Param("after", ("int", "size"), required=True),)),
            "cut_stream": KindSpec((Param("after", ("int",), required=True),)),
            "slow_first_byte": KindSpec((_dur("delay", required=True, positional=True),)),
            "slow_tokens": KindSpec((_dur("delay", required=True, positional=True),)),
            "latency": KindSpec((_dur("delay", required=True, positional=True), _dur("jitter"))),
            "missing_usage": KindSpec(),
        },
        counters=("call",),
    ),
    # Toxiproxy toxics; `call` counts connections through the fault proxy.
    "net": FamilySpec(
        "net",
        {
            "latency": KindSpec(
                (_dur("delay", required=True, positional=True), _dur("jitter"), _STREAM)
            ),
            "bandwidth": KindSpec(
                (Param("rate", ("rate",), required=True, positional=True), _STREAM)
            ),
            "slow_close": KindSpec((_dur("delay", required=True, positional=True), _STREAM)),
            "timeout": KindSpec((_dur("timeout", required=True, positional=True), _STREAM)),
            "reset_peer": KindSpec(
                (_dur("timeout", positional=True, default=Duration(0)), _STREAM)
            ),
            "slicer": KindSpec(
                (
                    Param("average_size", ("int",), required=True, minimum=1),
                    Param("size_variation", ("int",), default=0),
                    _dur("delay", default=Duration(0)),
                    _STREAM,
                )
            ),
            "limit_data": KindSpec(
                (Param("bytes", ("size",), required=True, positional=True), _STREAM)
            ),
            "down": KindSpec(),
        },
        counters=("call",),
    ),
    "ledger": FamilySpec(
        "ledger",
        {
            "enospc": KindSpec(),
            "eio": KindSpec(),
            "ebadf": KindSpec(),
            # the process dies mid-write: `keep` bytes of the line reach the disk
            "torn": KindSpec((Param("keep", ("size",), required=True, positional=True),)),
        },
        counters=("seq",),
        default_counter="seq",
    ),
    "clock": FamilySpec(
        "clock",
        {
            "step": KindSpec(
                (Param("by", ("signed_duration",), required=True, positional=True, nonzero=True),)
            ),
            "pause": KindSpec((_dur("for", required=True, positional=True, nonzero=True),)),
        },
        counters=("call", "seq"),
        default_counter="seq",
    ),
    "process": FamilySpec(
        "process",
        {"sigterm": KindSpec((_WHO,)), "sigkill": KindSpec((_WHO,))},
        counters=("call", "seq"),
        default_counter="seq",
    ),
}
