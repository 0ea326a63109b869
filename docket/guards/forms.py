"""Every form a known secret can take in text, as one pattern for both scrubbers.

What is recorded (docket.guards.redact.Redactor, str) and what is relayed to the
agent (docket.guards.scrub.Scrubber, bytes) take secrets out through the same
`SecretForms`, so an encoding one catches the other catches too:

- as written, in any letter case (a host name is lower-cased on the way in);
- any of its characters percent-encoded (each UTF-8 byte) or written as a JSON
  \\u escape (or JSON's short escape for '"', '\\' and '/'), mixed as an attacker
  likes; the secret's first PARTIAL_SECRET_CHARS characters are enough (a text cut
  before it reached a scrubber may end inside a secret);
- base64, standard and URL-safe alphabets, at each of the three alignments a
  secret can take inside a longer encoded run (the part of the encoding that does
  not depend on the surrounding bytes);
- hex, lower, upper or mixed case.

For a stream (`prefix_bytes`): the strings that are a proper prefix of some full
form, anchored at the end, so a scrubber holds back only the bytes that may still
grow into a secret (never more than `longest - 1` bytes, usually none).

Pure: built once per run from the secrets, then only searched.
"""

from __future__ import annotations

import base64
import functools
import re

# A secret shorter than this is not scrubbed: replacing every "sk" in a body would
# destroy the text and protect nothing real.
MIN_SCRUBBED_SECRET = 8
# A run of a secret's leading characters this long (or the whole of a shorter secret)
# is scrubbed too: a text cut to N characters before it reached the redactor may end
# inside a secret. Shorter than this, a prefix is mostly the provider's public one
# ("sk-proj-"), and replacing it would blank ordinary text about keys.
PARTIAL_SECRET_CHARS = 12

# What a match's named group says about the form it found (see `SecretForms.kind`).
KINDS = ("raw", "percent", "json", "base64", "hex")


class SecretForms:
    """The forms of `secrets` (each at least MIN_SCRUBBED_SECRET characters; shorter
    ones and repeats are left out): `text` and `bytes_` patterns for a whole text,
    `prefix_bytes` for a stream's held tail, and the quick literals (`heads`,
    `cores`) that a match must contain when the text holds no escape character."""

    def __init__(self, secrets) -> None:
        self.secrets = tuple(s for s in dict.fromkeys(secrets) if len(s) >= MIN_SCRUBBED_SECRET)
        branches: list[tuple[str, str]] = []  # (group kind, regex), one per form
        prefixes: list[str] = []
        self.heads: list[str] = []  # a text form's first characters, lower case
        self.cores: list[str] = []  # the base64 and hex forms, lower case
        lengths: list[int] = []
        longest = 0
        starts: set[bytes] = set()
        alphabet: set[int] = set()
        for secret in self.secrets:
            units = [_char_forms(c) for c in secret]
            for first in units[0]:  # one char, then the next's first byte; or an escape
                starts.update(_start(first, units[1]))
            for forms in units:
                for form in forms:
                    alphabet.update(form.encode().lower() + form.encode().upper())
            need = min(len(secret), PARTIAL_SECRET_CHARS)
            # The first `need` characters, then as many more as follow: the whole
            # secret, or what a cut left of it.
            tail = ""
            for forms in reversed(units[need:]):
                tail = f"(?:{_alternation(forms)}{tail})?"
            branches.append(("t", "".join(_alternation(f) for f in units[:need]) + tail))
            prefixes.append(_proper_prefixes(units))
            lengths.append(need)
            longest = max(longest, sum(max(len(f.encode()) for f in forms) for forms in units))
            self.heads.append(secret[:need].lower())
            for kind, core in _encoded_cores(secret):
                branches.append((kind, re.escape(core)))
                prefixes.append(_proper_prefixes([[c] for c in core]))
                lengths.append(len(core))
                longest = max(longest, len(core))
                self.cores.append(core.lower())
                starts.add(core[:4].encode().lower())
                alphabet.update(core.encode().lower() + core.encode().upper())
        # Longest first, so an alternation never stops at a shorter form's end.
        branches.sort(key=lambda b: len(b[1]), reverse=True)
        self._kind_of = {f"{kind}{i}": kind for i, (kind, _) in enumerate(branches)}
        source = "|".join(f"(?P<{kind}{i}>{rx})" for i, (kind, rx) in enumerate(branches))
        self.empty = not branches
        self.text = re.compile(source, re.IGNORECASE) if branches else None
        self.bytes_ = re.compile(source.encode(), re.IGNORECASE) if branches else None
        self._prefix_source = "|".join(p for p in prefixes if p)
        self.longest = longest  # the longest full form, in bytes
        # For a quick scan of bytes (docket.guards.scrub): every match begins with one
        # of `starts` (in the ASCII-lowered text), and every byte of a form is in
        # `alphabet` (so a held tail begins after the last byte that is not).
        self.starts = tuple(sorted(starts))
        self.alphabet = bytes(sorted(alphabet))
        self.shortest = min(lengths, default=0)
        # A backslash alone (a JSON "\\n") matters only to a secret with a character
        # JSON escapes in short form.
        self.short_escapes = any(c in s for s in self.secrets for c in '"\\/')

    @functools.cached_property
    def prefix_bytes(self) -> re.Pattern[bytes] | None:
        """The proper prefixes of every form, anchored at the end (for a stream's held
        tail). Compiled on first use: it is the largest pattern (~40 ms for three keys),
        and the ledger's redactor never needs it."""
        rest = self._prefix_source
        return re.compile(f"(?:{rest})\\Z".encode(), re.IGNORECASE | re.DOTALL) if rest else None

    def kind(self, match: re.Match) -> str:
        """Which form a match of `text`/`bytes_` is: raw, percent, json, base64, hex."""
        kind = self._kind_of[match.lastgroup or ""]
        if kind != "t":
            return "base64" if kind == "b" else "hex"
        found = match.group(0)
        pct, esc = ("%", "\\") if isinstance(found, str) else (b"%", b"\\")
        if esc in found:
            return "json"
        return "percent" if pct in found else "raw"


def _start(first: str, following: list[str]) -> set[bytes]:
    """What a match whose first character is written as `first` begins with, lowered:
    an escape on its own, a bare character with the first byte of the next one's form."""
    if len(first) > 1:
        return {first.encode().lower()}
    return {(first + form[0]).encode().lower() for form in following}


def _char_forms(char: str) -> list[str]:
    """One character of a secret as the literal strings it may be written as: itself,
    percent-encoded (each UTF-8 byte), a JSON \\u escape, JSON's short escape.
    Case is left to re.IGNORECASE (which also covers %2d/%2D and \\u002D)."""
    forms = [char, "".join(f"%{b:02x}" for b in char.encode("utf-8"))]
    if ord(char) < 0x10000:
        forms.append(f"\\u{ord(char):04x}")
    if char in '"\\/':
        forms.append("\\" + char)  # JSON's short escapes (\/ is legal)
    return forms


def _alternation(forms: list[str]) -> str:
    # Longest first: the optional tail of a secret's pattern does not backtrack into a
    # character's alternatives, so an escaped backslash (two characters) must be tried
    # before a bare one, and "%25" before "%".
    return "(?:" + "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)) + ")"


def _proper_prefixes(units: list[list[str]]) -> str:
    """A regex for the non-empty proper prefixes of the sequence `units` (each a
    character's literal forms): some whole units, then a proper prefix of the next
    one's form, or nothing more (short of the last unit). Built nested from the end,
    so its size grows with the secret's length, not its square."""
    after = ""  # the pattern for what may follow unit i (non-empty), or "" for none
    for i in range(len(units) - 1, -1, -1):
        forms = units[i]
        options = []
        if i < len(units) - 1:  # this unit whole is still short of the full form
            options.append(_alternation(forms) + (f"(?:{after})?" if after else ""))
        partial = sorted({f[:j] for f in forms for j in range(1, len(f))}, key=len, reverse=True)
        if partial:
            options.append("(?:" + "|".join(map(re.escape, partial)) + ")")
        after = "|".join(options)
    return after


def _encoded_cores(secret: str) -> list[tuple[str, str]]:
    """The base64 cores (kind "b") and the hex form (kind "h") of a secret.

    A base64 core is the part of the secret's encoding that is the same whatever
    bytes surround it, for each of the three offsets it can sit at in an encoded run,
    in both alphabets; a core shorter than the scrub minimum is left out (it would
    match too much). Hex needs no alignment: each byte is two characters."""
    raw = secret.encode("utf-8")
    cores: dict[str, str] = {}
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        # The first ceil(offset*4/3) characters mix in the padding bytes; the last
        # group may mix in what follows (and its '=' padding is not the secret's).
        start = -(-offset * 4 // 3)
        end = ((offset + len(raw)) // 3) * 4
        core = encoded[start:end]
        if len(core) >= MIN_SCRUBBED_SECRET:
            cores[core] = "b"
            cores[core.translate(_URLSAFE)] = "b"
    cores[raw.hex()] = "h"
    return [(kind, core) for core, kind in cores.items()]


_URLSAFE = str.maketrans("+/", "-_")
