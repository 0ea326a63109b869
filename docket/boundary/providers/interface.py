"""Provider: what the boundary asks of a provider's wire format.

openai.py and anthropic.py are its two implementations (modules that provide these
functions; mypy checks each against this Protocol where providers/__init__.py
registers them). A new provider is a module with its KIND and these seven functions, and
one line in that registry.
"""

from __future__ import annotations

from typing import Any, Protocol

from docket.boundary.providers.base import ProviderError, RequestFacts, StreamTracker, Usage
from docket.boundary.providers.headers import Headers


class Provider(Protocol):
    KIND: str  # the policy's `kind` for it ("openai", "anthropic")

    def request_facts(
        self, path: str, headers: Headers, body: bytes, *, method: str = ...
    ) -> RequestFacts:
        """Model, stream flag, output bound and endpoint of a request; BadRequest."""

    def prepare(self, facts: RequestFacts, body: bytes) -> tuple[bytes, bool]:
        """The body as forwarded, and whether a usage chunk was asked for (to strip)."""

    def credential(self, api_key: str) -> tuple[bytes, bytes]:
        """The header that carries the real key upstream."""

    def usage_from_body(self, endpoint: str, body: bytes) -> Usage | None: ...

    def stream_tracker(
        self, facts: RequestFacts, *, strip_usage_chunk: bool, max_event_bytes: int
    ) -> StreamTracker: ...

    def error_body(
        self, status: int, error_type: str, message: str, extra: dict[str, Any] | None = ...
    ) -> bytes:
        """An error in this provider's shape, as its SDK reads it."""

    def error_from_object(self, obj: object) -> ProviderError | None: ...
