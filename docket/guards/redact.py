"""Keep secrets out of the ledger: redacted headers and sanitized URLs.

Everything the boundary writes into an event about a request's headers or URL
goes through here first. The marker is fixed text, not a hash: a hash of a
secret is still a way to test guesses against the ledger.
"""

from __future__ import annotations

import base64
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

# A secret shorter than this is not scrubbed from recorded text: replacing every
# "sk" in a body would destroy the record and protect nothing real.
MIN_SCRUBBED_SECRET = 8
# A run of a secret's leading characters this long (or the whole of a shorter secret)
# is scrubbed too: a text cut to N characters before it reached the redactor may end
# inside a secret. Shorter than this, a prefix is mostly the provider's public one
# ("sk-proj-"), and replacing it would blank ordinary text about keys.
PARTIAL_SECRET_CHARS = 12


class Redactor:
    """Takes the secrets the boundary knows (the run token, the provider keys) out of
    text, in every form they can arrive in: as written, in any letter case (a host
    name is lower-cased on the way in), with any of their characters percent-encoded
    or written as a JSON \\u escape (one character at a time, mixed as an attacker
    likes), and base64-encoded (standard and URL-safe alphabets, at each of the three
    alignments a secret can take inside a longer encoded run).

    `fields` is the one door every event built from the agent's or the upstream's
    bytes passes before it reaches the ledger (Boundary.record and its two siblings):
    whatever a caller forgot to scrub, this does not. A secret's first
    PARTIAL_SECRET_CHARS characters are enough to match (a field cut before it
    was scrubbed still loses the part it holds). Pure, and iterative: an event's
    values are walked with a stack, never by recursion.
    """

    def __init__(self, secrets) -> None:
        self.secrets = tuple(s for s in dict.fromkeys(secrets) if len(s) >= MIN_SCRUBBED_SECRET)
        branches: list[str] = []
        lengths: list[int] = []
        # For the quick test (`_maybe`): what a match must contain when the text
        # holds no escape ('%' or a backslash).
        self._heads: list[str] = []
        self._cores: list[str] = []
        for secret in self.secrets:
            # The secret's first PARTIAL_SECRET_CHARS characters, then as many more as
            # follow: the whole secret, or what a cut (a field shortened to N
            # characters before it was scrubbed) left of it.
            need = min(len(secret), PARTIAL_SECRET_CHARS)
            tail = ""
            for char in reversed(secret[need:]):
                tail = f"(?:{_char_pattern(char)}{tail})?"
            branches.append("".join(_char_pattern(c) for c in secret[:need]) + tail)
            lengths.append(need)
            self._heads.append(secret[:need].lower())
            for core in _base64_cores(secret):
                branches.append(re.escape(core))
                lengths.append(len(core))
                self._cores.append(core)
        # Longest first, so an alternation never stops at a shorter form's end.
        branches.sort(key=len, reverse=True)
        self._pattern = re.compile("|".join(branches), re.IGNORECASE) if branches else None
        # A backslash alone (a JSON "\\n") matters only to a secret with a character
        # JSON escapes in short form.
        self._short_escapes = any(c in secret for secret in self.secrets for c in '"\\/')
        quick = sorted(
            {*self._heads, *(core.lower() for core in self._cores)}, key=len, reverse=True
        )
        self._quick = re.compile("|".join(map(re.escape, quick)))
        self._shortest = min(lengths, default=0)

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
        if pattern is None:  # fields() asks only with a pattern; without one, nothing matches
            return False
        search = pattern.search
        return any(self._maybe(text) and search(text) for text in strings)


def _char_pattern(char: str) -> str:
    """One character of a secret as a regex: itself, percent-encoded (each UTF-8 byte),
    or a JSON \\u escape. Case is left to re.IGNORECASE (which also covers %2d/%2D)."""
    forms = [re.escape(char)]
    forms.append(re.escape("".join(f"%{b:02x}" for b in char.encode("utf-8"))))
    if ord(char) < 0x10000:
        forms.append(re.escape(f"\\u{ord(char):04x}"))
    if char in '"\\/':
        forms.append(re.escape("\\" + char))  # JSON's short escapes (\/ is legal)
    # Longest first: the optional tail of a secret's pattern does not backtrack into a
    # character's alternatives, so an escaped backslash (two characters) must be tried
    # before a bare one, and "%25" before "%".
    return "(?:" + "|".join(sorted(forms, key=len, reverse=True)) + ")"


def _base64_cores(secret: str) -> set[str]:
    """The part of the secret's base64 encoding that is the same whatever bytes
    surround it, for each of the three offsets it can sit at in an encoded run,
    in both alphabets. A core shorter than the secret's scrub minimum is left out
    (it would match too much)."""
    raw = secret.encode("utf-8")
    cores: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        # The first ceil(offset*4/3) characters mix in the padding bytes; the last
        # group may mix in what follows (and its '=' padding is not the secret's).
        start = -(-offset * 4 // 3)
        end = ((offset + len(raw)) // 3) * 4
        core = encoded[start:end]
        if len(core) >= MIN_SCRUBBED_SECRET:
            cores.add(core)
            cores.add(core.translate(_URLSAFE))
    return cores


_URLSAFE = str.maketrans("+/", "-_")
