"""Recorded bodies: the event fields that record a request's or an answer's bytes.

With the policy's `record_bodies`, model.request carries the request body and
the closing event the response body (`recorded_body`). Pure: app.py records the
request body, forward.ModelCall the response body (it reads RECORDED_BODY_BYTES
from here, so the cap is one value). Split from forward.py, which still
re-exports recorded_body.

The rule: no byte of a body reaches an event unless it has been through the
redactor, whatever the body's size, encoding or shape. A body is recorded as
text only when it parses as JSON or as a server-sent-event stream whose data are
JSON; then every string in it is decoded (escapes and all) and checked, and the
values of credential-named members are replaced (docket.guards.credential_names:
`accessToken`, `ACCESS_TOKEN` and `access-token` alike). Anything else (not UTF-8, not
JSON, malformed, nested deeper than RECORDED_BODY_DEPTH) is recorded as its
SHA-256 and length only, with `<prefix>_body_not_recorded` saying why. A body
over RECORDED_BODY_BYTES is cut, and the cut prefix goes through the same parser
(a token the cut split is dropped, so no half-secret is left at the end).

The parser is a flat loop over tokens with an explicit stack: no recursion, so
no nesting depth can raise RecursionError here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from docket.guards.credential_names import ANY_CREDENTIAL_WORD, is_credential_member
from docket.guards.redact import MARKER, Redactor

# With record_bodies, each body is recorded up to this many bytes (and flagged if cut):
# one event must stay far below the ledger's line limit and its byte ceiling.
RECORDED_BODY_BYTES = 1 << 20
# A JSON body nested deeper than this (objects and arrays) is not recorded, only
# hashed: `<prefix>_body_not_recorded: "too_deep"`. No provider's API nests near it;
# the bound keeps every later reader of the ledger (json.loads, jq) far from its
# own recursion limit.
RECORDED_BODY_DEPTH = 64

_MARKER_JSON = json.dumps(MARKER)

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\n\r]+)
  | (?P<str>"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*")
  | (?P<num>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<lit>true|false|null)
  | (?P<punct>[{}\[\]:,])
    """,
    re.VERBOSE,
)


class NotRecorded(Exception):
    """Why a body is recorded as its hash and length only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def recorded_body(
    prefix: str, data: bytes, secrets: Redactor | Iterable[str], *, cut: bool = False
) -> dict[str, object]:
    """The event fields recording one body: `<prefix>_body` (the text, redacted), with
    `<prefix>_body_truncated` when cut to RECORDED_BODY_BYTES and
    `<prefix>_body_redacted` when anything was taken out; or, for a body that cannot
    be parsed, `<prefix>_body_not_recorded` (the reason), `<prefix>_body_sha256` and
    `<prefix>_body_bytes` (of the bytes kept, the cut prefix if cut).

    `secrets`: a Redactor, or the secrets to build one from (the run token, the
    provider keys). The request's size and hash in model.request stay those of the
    bytes as sent.
    """
    redactor = secrets if isinstance(secrets, Redactor) else Redactor(secrets)
    if len(data) > RECORDED_BODY_BYTES:
        data, cut = data[:RECORDED_BODY_BYTES], True
    fields: dict[str, object] = {}
    try:
        text, redacted = redact_body(_utf8(data, cut), redactor, cut=cut)
        fields[f"{prefix}_body"] = text
        if redacted:
            fields[f"{prefix}_body_redacted"] = True
    except NotRecorded as why:
        fields[f"{prefix}_body_not_recorded"] = why.reason
        fields[f"{prefix}_body_sha256"] = hashlib.sha256(data).hexdigest()
        fields[f"{prefix}_body_bytes"] = len(data)
    if cut:
        fields[f"{prefix}_body_truncated"] = True
    return fields


def redact_body(text: str, redactor: Redactor, *, cut: bool = False) -> tuple[str, bool]:
    """A body's text with credentials out, and whether any were; NotRecorded if the
    text is neither JSON nor an event stream of JSON (`cut`: it may end mid-token)."""
    stripped = text.lstrip(" \t\r\n")
    if not stripped:
        return text, False
    if stripped[0] in '{["-0123456789tfn':
        return redact_json(text, redactor, cut=cut)
    return _redact_sse(text, redactor, cut=cut)


def redact_json(text: str, redactor: Redactor, *, cut: bool = False) -> tuple[str, bool]:
    """One JSON value's text with every string holding a secret, and every value of a
    credential-named member, replaced by the marker; the rest byte for byte as it came.
    NotRecorded("malformed") if it is not JSON, ("too_deep") past RECORDED_BODY_DEPTH.
    `cut`: the text is a prefix; it may end anywhere, and a token it splits is dropped."""
    if not cut and _nothing_to_take(text, redactor):
        return text, False
    return _redact_tokens(text, redactor, cut=cut)


# A string token, for the quick path (it replaces every string before brackets are counted).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def _nothing_to_take(text: str, redactor: Redactor) -> bool:
    """True when the text is JSON within the depth bound with nothing to redact: no
    form of a known secret anywhere, no word a credential-named key could hold, and no
    \\u escape that could hide one. Decided at C speed (a 1 MiB body in a few
    milliseconds, where the token loop takes a few hundred); False sends the text
    to the token loop, which decides everything itself."""
    if redactor.maybe(text) or "\\u" in text or ANY_CREDENTIAL_WORD.search(text.lower()):
        return False
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > RECORDED_BODY_DEPTH:
            raise NotRecorded("too_deep")
    try:
        json.loads(text)  # now known to nest no deeper than the bound: no recursion limit
    except ValueError:
        raise NotRecorded("malformed") from None
    return True


def _redact_tokens(text: str, redactor: Redactor, *, cut: bool = False) -> tuple[str, bool]:
    out: list[str] = []
    changed = False
    stack: list[str] = []  # "{" or "["
    state = "value"  # value | key | colon | after | done
    first = False  # just after "{" or "[": the container may close at once
    hide = False  # the next value belongs to a credential-named member
    skip_to = -1  # inside a hidden container: emit nothing until the stack is this deep
    pos, end = 0, len(text)
    match = _TOKEN.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            if cut and _split_token(text, pos):
                break  # the cut split this token: drop it
            raise NotRecorded("malformed")
        kind, token = m.lastgroup, m.group()
        pos = m.end()
        if kind == "ws":
            if skip_to < 0:
                out.append(token)
            continue
        if cut and pos == end and kind in ("num", "lit"):
            break  # possibly split by the cut ("12" of "123"): dropped like any other
        if state == "done":
            raise NotRecorded("malformed")
        if kind == "punct":
            if token in "{[":
                if state != "value":
                    raise NotRecorded("malformed")
                if len(stack) >= RECORDED_BODY_DEPTH:
                    raise NotRecorded("too_deep")
                if hide:
                    out.append(_MARKER_JSON)
                    changed, hide, skip_to = True, False, len(stack)
                elif skip_to < 0:
                    out.append(token)
                stack.append(token)
                state, first = ("key" if token == "{" else "value"), True
                continue
            if token in "}]":
                opener = "{" if token == "}" else "["
                closes_empty = first and state == ("key" if token == "}" else "value")
                if not stack or stack[-1] != opener or not (state == "after" or closes_empty):
                    raise NotRecorded("malformed")
                stack.pop()
                if skip_to < 0:
                    out.append(token)
                elif len(stack) == skip_to:
                    skip_to = -1
                state, first = ("after" if stack else "done"), False
                continue
            if token == ":":
                if state != "colon":
                    raise NotRecorded("malformed")
                state = "value"
            else:  # ","
                if state != "after" or not stack:
                    raise NotRecorded("malformed")
                state = "key" if stack[-1] == "{" else "value"
            first = False
            if skip_to < 0:
                out.append(token)
            continue
        # A string, number or literal.
        first = False
        if state == "key":
            if kind != "str":
                raise NotRecorded("malformed")
            if skip_to < 0:
                name = _decoded(token)
                hide = is_credential_member(name)
                token, hit = _checked(token, name, redactor)
                changed = changed or hit
                out.append(token)
            state = "colon"
            continue
        if state != "value":
            raise NotRecorded("malformed")
        state = "after" if stack else "done"
        if skip_to >= 0:
            continue
        if hide:
            hide = False
            if token not in ('""', "null"):
                out.append(_MARKER_JSON)
                changed = True
                continue
        if kind == "str":
            token, hit = _checked(token, _decoded(token), redactor)
            changed = changed or hit
        out.append(token)
    if not cut and state != "done":
        raise NotRecorded("malformed")  # ended early: not one whole JSON value
    if not changed and pos == end:
        return text, False
    return "".join(out), changed


# What a string token cut short looks like: valid so far, up to the end of the text.
_PARTIAL_STRING = re.compile(
    r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*(?:\\(?:u[0-9a-fA-F]{0,3})?)?\Z'
)


def _split_token(text: str, pos: int) -> bool:
    """Whether what is left at `pos` is the start of a token the cut ended (else the
    text is malformed before the cut, and is not recorded)."""
    rest = text[pos:]
    if rest[:1] == '"':
        return _PARTIAL_STRING.match(rest) is not None
    # A literal's start, or a number's tail ("1." or "1e" after the token "1").
    return any(word.startswith(rest) for word in ("true", "false", "null")) or (
        _NUMBER_TAIL.match(rest) is not None
    )


_NUMBER_TAIL = re.compile(r"[-+0-9.eE]+\Z")


def _decoded(token: str) -> str:
    # A string token as matched decodes without error (lone surrogates included).
    return json.loads(token) if "\\" in token else token[1:-1]


def _checked(token: str, decoded: str, redactor: Redactor) -> tuple[str, bool]:
    """The string token with every secret in it (decoded, or as written) replaced by
    the marker, re-encoded as a JSON string if anything was; the whole string becomes
    the marker when a secret is only visible in its escaped form."""
    scrubbed, hit = redactor.text(decoded)
    if hit:
        token = json.dumps(scrubbed, ensure_ascii=_SURROGATE.search(scrubbed) is not None)
    if "\\" in token and redactor.text(token)[1]:
        return _MARKER_JSON, True
    return token, hit


_SURROGATE = re.compile("[\ud800-\udfff]")


# An event stream's line: a field ("data", "event", "id", "retry") or a comment.
_SSE_LINE = re.compile(r"(?:data|event|id|retry)(?::.*)?|:.*|", re.DOTALL)
_SSE_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _redact_sse(text: str, redactor: Redactor, *, cut: bool) -> tuple[str, bool]:
    """A server-sent-event stream: each data payload must be JSON (or "[DONE]"), each
    other line is scrubbed of known secrets; NotRecorded("not_json") for anything else."""
    # Lines end at CR, LF or CRLF only (str.splitlines would also split at U+2028 and
    # others, which a JSON string may hold as they are).
    lines = _SSE_LINES.findall(text)
    out: list[str] = []
    changed = False
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        body = line.rstrip("\r\n")
        if cut and last and body == line:
            break  # the cut split this line: drop it
        if not _SSE_LINE.fullmatch(body):
            raise NotRecorded("not_json")
        if body.startswith("data:"):
            payload = body[5:].removeprefix(" ")
            if payload.strip() in ("", "[DONE]"):
                out.append(line)
                continue
            try:
                redacted, hit = redact_json(payload, redactor)
            except NotRecorded as why:
                raise NotRecorded("not_json" if why.reason == "malformed" else why.reason) from None
            out.append(body[: len(body) - len(payload)] + redacted + line[len(body) :])
            changed = changed or hit
            continue
        scrubbed, hit = redactor.text(line)
        out.append(scrubbed)
        changed = changed or hit
    return "".join(out), changed


def _utf8(data: bytes, cut: bool) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A cut can split the last character (a valid start of one, at most 3 bytes
        # from the end); anything else is not text.
        if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8")
        raise NotRecorded("not_utf8") from None
