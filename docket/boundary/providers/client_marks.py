"""The client's own attempt marker and correlation ids, read from a request's headers.

The openai and anthropic SDKs retry a failed call themselves and say which try
a request is in `x-stainless-retry-count` (0 on the first). Clients may also
send an idempotency key or a request id of their own. The boundary records
them on `model.request` (`client_attempt`, `client_ids`) so that a reader can
tell an SDK's retries from new calls; the boundary itself never retries.

The values are the agent's input, so they are held to a narrow grammar and a
length: an attempt is a decimal integer of at most three digits; an id is 1 to
MAX_ID_CHARS printable ASCII characters with no space. A value that breaks the
grammar, is sent twice, looks like a credential, or holds a secret the
boundary knows (the scrub function changes it) is not recorded; its header's
name is, in `client_marks_rejected`. Pure: headers in, fields out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

ATTEMPT_HEADER = b"x-stainless-retry-count"
# Header (lowercase) -> the key it is recorded under in `client_ids`. Who sends
# which: docs/clients.md.
ID_HEADERS = {
    b"idempotency-key": "idempotency_key",
    b"x-client-request-id": "client_request_id",
    b"x-request-id": "request_id",
}
_WANTED = frozenset({ATTEMPT_HEADER, *ID_HEADERS})
MAX_ID_CHARS = 128
_ATTEMPT = re.compile(rb"0|[1-9][0-9]{0,2}")
_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_ID_CHARS)
# Well-known credential prefixes (OpenAI and Anthropic keys, AWS access keys,
# GitHub tokens, Google API keys, Slack tokens): an "id" starting so is a key
# pasted into the wrong header, and a key the boundary does not know cannot be
# scrubbed, so it is not recorded at all.
_CREDENTIAL_LIKE = re.compile(rb"(?i:sk-|rk-|bearer|basic)|AKIA|ASIA|gh[pousr]_|AIza|xox[abprs]-")


@dataclass(frozen=True)
class ClientMarks:
    """What one request's headers said about the client's attempt and ids."""

    attempt: int | None = None
    ids: dict[str, str] = field(default_factory=dict)
    rejected: tuple[str, ...] = ()  # header names whose value was not recorded

    def as_fields(self) -> dict[str, Any]:
        """The model.request fields, each only when there is something to say."""
        fields: dict[str, Any] = {}
        if self.attempt is not None:
            fields["client_attempt"] = self.attempt
        if self.ids:
            fields["client_ids"] = dict(self.ids)
        if self.rejected:
            fields["client_marks_rejected"] = list(self.rejected)
        return fields


_NONE = ClientMarks()


def _unchanged(text: str) -> str:
    return text


def client_marks(
    headers: Iterable[tuple[bytes | str, bytes | str]],
    scrub: Callable[[str], str] = _unchanged,
) -> ClientMarks:
    """The attempt marker and ids in `headers` (h11's bytes pairs, or str).

    `scrub` takes known secrets out of text (the boundary's Redactor.scrub): an id
    it changes is rejected rather than recorded with a marker in it.
    """
    seen: dict[bytes, list[bytes]] = {}
    for name, value in headers:  # on every call's path: the common case is kept cheap
        key = name.lower() if isinstance(name, bytes) else name.lower().encode("latin-1", "replace")
        if key in _WANTED:
            raw = value if isinstance(value, bytes) else value.encode("latin-1", "replace")
            seen.setdefault(key, []).append(raw.strip(b" \t"))
    if not seen:
        return _NONE
    attempt: int | None = None
    ids: dict[str, str] = {}
    rejected: list[str] = []
    for key, values in seen.items():
        value = values[0]
        if key == ATTEMPT_HEADER:
            if len(values) == 1 and _ATTEMPT.fullmatch(value):
                attempt = int(value)
            else:
                rejected.append(key.decode())
            continue
        text = value.decode("ascii", "replace")
        if (
            len(values) == 1
            and _ID.fullmatch(value)
            and not _CREDENTIAL_LIKE.match(value)
            and scrub(text) == text
        ):
            ids[ID_HEADERS[key]] = text
        else:
            rejected.append(key.decode())
    return ClientMarks(attempt, dict(sorted(ids.items())), tuple(sorted(rejected)))
