"""Whether a JSON member's name says its value is a credential, however it is spelled.

A recorded body (docket.boundary.bodies) has the value of every credential-named
member replaced. Providers and SDKs spell one name many ways: `access_token`,
`accessToken`, `AccessToken`, `ACCESS_TOKEN`, `access-token`, `accesstoken`. So the
name is read as words first (`words`: camelCase split, case folded, `-`, `.` and
spaces read as `_`), and the vocabulary is matched on the words and on their
joined form.

Narrower than the header rule (docket.guards.redact) on purpose: `max_tokens` and
`prompt_tokens` are counts, `prompt_cache_key` and `idempotency_key` are not
secrets, a thinking block's `signature` is the provider's own opaque text, and a
tokenizer's `eos_token` or a page's `next_token` is not a credential.
"""

from __future__ import annotations

import re

# Anywhere in the joined name: "aws_secret_access_key", "clientSecret", "x-api-key".
_INSIDE = re.compile(
    r"secret|passw|passphrase|passcode|credential|cookie|authorization"
    r"|(?:api|private|access|session|signing|encryption)key"
)
# Whole words: a short one that is only a credential standing alone.
_WORDS = frozenset({"pwd", "auth", "bearer", "jwt"})
# "<word>_token" is a credential (access, refresh, id, github, hf, ...) except after these.
_NOT_CREDENTIAL_TOKEN = frozenset(
    {"eos", "bos", "pad", "unk", "sep", "cls", "mask", "stop", "next", "page",
     "continuation", "start", "end", "sample", "max", "min"}
)  # fmt: skip

# Lower-cased text that any credential name holds (a superset of the rules above): a
# body without any of these has no credential-named member (the quick path).
ANY_CREDENTIAL_WORD = re.compile(
    r"secret|pass|credential|cookie|auth|api|private|access|session|signing|encryption"
    r"|pwd|bearer|token|jwt"
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


def words(name: str) -> list[str]:
    """A member name as lower-case words: 'refreshToken', 'Refresh-Token', 'REFRESH_TOKEN'
    and 'refresh token' all read ['refresh', 'token']."""
    return [w for w in _SEPARATORS.split(_CAMEL.sub("_", name).lower()) if w]


def is_credential_member(name: str) -> bool:
    """Whether the value of a JSON member of this name is a credential."""
    split = words(name)
    if not split:
        return False
    if _INSIDE.search("".join(split)) or _WORDS.intersection(split):
        return True
    # A token of something (not a count, "tokens"; not a tokenizer's or a page's):
    # "access_token", "idToken", "github_token", and "accesstoken" written as one word.
    last = split[-1]
    if last.endswith("token") and last != "tokens":
        owner = split[-2] if len(split) > 1 else last.removesuffix("token")
        return owner not in _NOT_CREDENTIAL_TOKEN
    return False
