"""A call's closing event: what it records, and the room held for it.

`CallRecord` is what one call has done so far and `usage_fields` its known
counts, both turned into the model.response or model.error fields by
forward.ModelCall; `closing_bound` is the room app.py asks the ledger to hold
for those fields when it writes the call's model.request. Split from
forward.py, which still re-exports these names.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from docket.boundary import providers

# The room a model.request holds in the ledger for its closing event's fields, beyond
# the call id, provider and model (counted as they encode): every other field is
# bounded here. The texts are cut (detail 300, upstream_error's type and message
# 200 each, stream_problem 200, retry_after 64 characters: at most 6 bytes each in
# JSON, 5.6 KiB), and the rest are numbers (with room for 20-digit counts), flags and
# a price table's unit prices. (A larger count from a misbehaving upstream is still
# written: the ledger lets a closing event's essential fields use its control reserve.)
# The response body is not held for: its fields are optional, written when the file
# has room and otherwise left out, the event saying `trimmed: true`. Holding a body's
# 1 MiB cap for every call in flight would make admission depend on concurrency, and
# refuse every call under a ceiling of a few MiB.
CLOSING_FIXED_BYTES = 8 << 10
RESPONSE_BODY_FIELDS = (
    "response_body",
    "response_body_truncated",
    "response_body_redacted",
    "response_body_not_recorded",
    "response_body_sha256",
    "response_body_bytes",
)


def closing_bound(call_id: str, provider: str, model: str | None) -> int:
    """The bound on a closing event's fields, without the response body's, that the
    call's model.request holds room for (ledger.append_opening's closing_bytes)."""
    if _PLAIN_ID.fullmatch(call_id):  # the boundary's own ids: each character one byte
        return _closing_names_bound(provider, model or "") + len(call_id)
    names = json.dumps([call_id, provider, model or ""], ensure_ascii=False).encode()
    return CLOSING_FIXED_BYTES + len(names)


_PLAIN_ID = re.compile(r"[A-Za-z0-9_.-]*")


@functools.lru_cache(maxsize=256)  # a run calls a few models through a few providers
def _closing_names_bound(provider: str, model: str) -> int:
    """closing_bound of an empty call id (a plain id adds its length: its JSON is itself)."""
    return CLOSING_FIXED_BYTES + len(json.dumps(["", provider, model], ensure_ascii=False).encode())


@dataclass
class CallRecord:
    """What one call has done so far; turned into the closing event's fields."""

    call_id: str
    provider: str
    model: str | None
    started: float  # monotonic seconds
    status: int | None = None
    ttfb: float | None = None
    bytes: int = 0
    usage: providers.Usage | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def usage_fields(usage: providers.Usage | None) -> dict[str, Any]:
    """Known counts only: a count the provider did not report is absent, never zero."""
    if usage is None:
        return {}
    out = {}
    for name in ("input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens"):
        value = getattr(usage, name)
        if value is not None:
            out[name] = value
    if usage.cache_write_1h_tokens is not None:
        out["cache_write_1h_tokens"] = usage.cache_write_1h_tokens
    return out
