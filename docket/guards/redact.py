"""Keep secrets out of the ledger: redacted headers and sanitized URLs.

Everything the boundary writes into an event about a request's headers or URL
goes through here first. The marker is fixed text, not a hash: a hash of a
secret is still a way to test guesses against the ledger.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

MARKER = "[redacted]"

# Header names that carry credentials, by exact name or by what the name says.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
    }
)
_SECRET_HEADER_WORDS = re.compile(
    r"auth|token|secret|passw|api-?key|cookie|session|signature|credential"
)

# Query parameter names that carry credentials: a word anywhere in the name
# ("access_token", "X-Amz-Signature", "apiKey"), or a short word standing alone
# or as a separated part ("key", "sig", "x-goog-auth").
_SECRET_PARAM = re.compile(
    r"token|secret|passw|signature|credential|api_?-?key|apikey|session|private"
    r"|(?:^|[^a-z0-9])(?:key|sig|pwd|auth|authorization|code|jwt|pass)(?:$|[^a-z0-9])"
)
# An auth scheme word worth keeping in front of the marker ("Bearer [redacted]").
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,19}")


def is_secret_header(name: str | bytes) -> bool:
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    name = name.lower()
    return name in SECRET_HEADERS or _SECRET_HEADER_WORDS.search(name) is not None


def redact_headers(headers) -> list:
    """The (name, value) pairs with every credential value replaced by the marker.

    Names and values keep their type (bytes or str). An Authorization-like value
    keeps its scheme word, so the record still says how the client authenticated.
    """
    out = []
    for name, value in headers:
        if is_secret_header(name):
            value = _redact_value(value)
        out.append((name, value))
    return out


def _redact_value(value: str | bytes) -> str | bytes:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    scheme, space, rest = text.strip().partition(" ")
    marked = f"{scheme} {MARKER}" if space and rest and _SCHEME.fullmatch(scheme) else MARKER
    return marked.encode("latin-1") if isinstance(value, bytes) else marked


@functools.lru_cache(maxsize=256)  # the boundary asks for the same few paths on every call
def sanitize_url(url: str) -> str:
    """The URL without userinfo and with secret-looking query values replaced.

    The fragment is treated like a query (OAuth implicit flows put tokens
    there). A secret embedded in a path segment cannot be told from a name
    and is left as it is. An unparseable URL becomes a fixed marker rather than
    being copied into the record.
    """
    if "://" not in url and not url.startswith("/"):
        # Authority form (a CONNECT target), or no URL at all: keep only host:port.
        host = url.rpartition("@")[2]
        return _sanitize_query(host) if "=" in host else host
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        return urlunsplit(
            (
                parts.scheme,
                netloc,
                parts.path,
                _sanitize_query(parts.query),
                _sanitize_query(parts.fragment),
            )
        )
    except ValueError:
        return "[unparseable url]"


def _sanitize_query(query: str) -> str:
    if not query or "=" not in query:
        return query
    pieces = query.split("&")
    for i, piece in enumerate(pieces):
        name, eq, value = piece.partition("=")
        if eq and value and _SECRET_PARAM.search(unquote_plus(name).lower()):
            pieces[i] = f"{name}={MARKER}"
    return "&".join(pieces)


# A command-line flag whose value is a credential: --api-key X, --token=X, -p X is not
# guessed at (too short to tell); the flag's name is kept so a reader sees what was there.
_SECRET_FLAG = re.compile(
    r"^--?[A-Za-z0-9_-]*(?:token|secret|passw|api-?key|apikey|auth|credential)[A-Za-z0-9_-]*$", re.I
)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line fit for the ledger: values of credential-named flags replaced,
    URLs sanitised (userinfo and secret query parameters)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MARKER)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if _SECRET_FLAG.match(name):
            if eq:
                out.append(f"{name}={MARKER}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(sanitize_url(arg) if "://" in arg else arg)
    return out
