"""Keep secrets out of the ledger: redacted headers and sanitized URLs.

Everything the boundary writes into an event about a request's headers or URL
goes through here first. The marker is fixed text, not a hash: a hash of a
secret is still a way to test guesses against the ledger.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from docket.guards.forms import MIN_SCRUBBED_SECRET as MIN_SCRUBBED_SECRET
from docket.guards.forms import PARTIAL_SECRET_CHARS as PARTIAL_SECRET_CHARS
from docket.guards.forms import SecretForms

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
    # "&" or the older ";" between parameters (some servers still split on it).
    pieces = _PARAM_SEPARATOR.split(query)
    for i in range(0, len(pieces), 2):
        name, eq, value = pieces[i].partition("=")
        if eq and value and _SECRET_PARAM.search(unquote_plus(name).lower()):
            pieces[i] = f"{name}={MARKER}"
    return "".join(pieces)


_PARAM_SEPARATOR = re.compile("([&;])")


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


# ---------------------------------------------------------------- known secrets, in any form


class Redactor:
    """Takes the secrets the boundary knows (the run token, the provider keys) out of
    text, in every form they can arrive in (docket.guards.forms: as written in any
    letter case, percent-encoded or JSON-escaped a character at a time, base64 in
    both alphabets at any alignment, hex). The relay's scrubber (guards/scrub.py)
    uses the same forms, so what the agent receives and what is recorded lose the
    same encodings.

    `fields` is the one door every event built from the agent's or the upstream's
    bytes passes before it reaches the ledger (Boundary.record and its two siblings):
    whatever a caller forgot to scrub, this does not. A secret's first
    PARTIAL_SECRET_CHARS characters are enough to match (a field cut before it
    was scrubbed still loses the part it holds). Pure, and iterative: an event's
    values are walked with a stack, never by recursion.
    """

    def __init__(self, secrets) -> None:
        self.forms = SecretForms(secrets)
        self.secrets = self.forms.secrets
        self._pattern = self.forms.text
        self._short_escapes = self.forms.short_escapes
        quick = sorted({*self.forms.heads, *self.forms.cores}, key=len, reverse=True)
        self._quick = re.compile("|".join(map(re.escape, quick)))
        self._shortest = self.forms.shortest

    def text(self, text: str) -> tuple[str, bool]:
        """`text` with every form of every secret replaced by the marker; and whether any was."""
        if self._pattern is None or not self._maybe(text):
            return text, False
        new, count = self._pattern.subn(MARKER, text)
        return new, count > 0

    def _maybe(self, text: str) -> bool:
        """False only when no form of any secret can be in `text`: a few substring
        searches instead of the full pattern (which costs microseconds on every
        event). Without an escape character, a match holds a secret's head (in any
        case) or one of its base64 cores as plain substrings."""
        if len(text) < self._shortest:
            return False
        if "%" in text or "\\u" in text or (self._short_escapes and "\\" in text):
            return True
        return self._quick.search(text.lower()) is not None

    def maybe(self, text: str) -> bool:
        """Whether `text` may hold a form of a secret (False: it certainly does not)."""
        return self._pattern is not None and self._maybe(text)

    def scrub(self, text: str) -> str:
        return self.text(text)[0]

    def fields(self, fields: dict) -> dict:
        """An event's fields with every string in them (keys too, at any depth) scrubbed.
        The same dict when nothing needed it (the common case costs no copy)."""
        if self._pattern is None or not self._any(fields):
            return fields
        # Copied top-down with an explicit stack: each new container is put in its
        # parent at once and filled when its turn comes, so no recursion is needed.
        out: dict = {}
        stack: list[tuple] = [(fields, out)]
        while stack:
            source, target = stack.pop()
            pairs = source.items() if isinstance(source, dict) else enumerate(source)
            for key, value in pairs:
                if isinstance(source, dict) and isinstance(key, str):
                    key = self.scrub(key)
                if isinstance(value, str):
                    value = self.scrub(value)
                elif isinstance(value, dict):
                    child: dict | list = {}
                    stack.append((value, child))
                    value = child
                elif isinstance(value, list | tuple):
                    child = [None] * len(value)
                    stack.append((value, child))
                    value = child
                target[key] = value  # a dict's key, or a list's index
        return out

    def _any(self, root) -> bool:
        """Whether any string in `root` (keys included) holds a secret; iterative. The
        strings are tested together first (one quick search for the whole event: no
        secret's form holds a NUL, so none can match across the joins)."""
        strings: list[str] = []
        stack = [root]
        while stack:
            value = stack.pop()
            if isinstance(value, str):
                strings.append(value)
            elif isinstance(value, dict):
                stack.extend(value.keys())
                stack.extend(value.values())
            elif isinstance(value, list | tuple):
                stack.extend(value)
        if not self._maybe("\0".join(strings)):
            return False
        pattern = self._pattern
        if pattern is None:  # callers check first; this keeps the method whole on its own
            return False
        search = pattern.search
        return any(self._maybe(text) and search(text) for text in strings)
