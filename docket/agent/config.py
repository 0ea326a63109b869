"""The reference agent's settings: the environment, overridden by flags, checked once.

`config_from` turns them into a frozen AgentConfig or raises an InputError whose
one line names what the user typed: the flag when a flag set it, the variable
otherwise (exit 2). Nothing here touches the network or the clock.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from docket.agent.backoff import BackoffPolicy
from docket.agent.budget import DEFAULT_FLOOR, DEFAULT_RATIO, ratio_from
from docket.errors import InputError
from docket.fields import Fields
from docket.values import ValueProblem, parse_whole

MODES = ("once", "stream", "loop", "hammer", "backoff", "repeat")
PROVIDERS = ("openai", "anthropic")
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku-20241022"}
ANTHROPIC_VERSION = "2023-06-01"

# The flag that overrides each setting, so an error names what the user typed.
FLAGS = {
    "DOCKET_AGENT_PROVIDER": "--provider",
    "DOCKET_AGENT_MODE": "--mode",
    "DOCKET_AGENT_CALLS": "--calls",
    "DOCKET_AGENT_CONCURRENCY": "--concurrency",
    "DOCKET_AGENT_MODEL": "--model",
    "DOCKET_AGENT_MAX_TOKENS": "--max-tokens",
    "DOCKET_AGENT_TIMEOUT": "--timeout",
    "DOCKET_AGENT_SEED": "--seed",
    "DOCKET_AGENT_BACKOFF_BASE": "--backoff-base",
    "DOCKET_AGENT_BACKOFF_CAP": "--backoff-cap",
    "DOCKET_AGENT_MAX_ATTEMPTS": "--max-attempts",
    "DOCKET_AGENT_MAX_RETRY_AFTER": "--max-retry-after",
    "DOCKET_AGENT_DEADLINE": "--deadline",
    "DOCKET_AGENT_RETRY_RATIO": "--retry-ratio",
    "DOCKET_AGENT_RETRY_FLOOR": "--retry-floor",
    "DOCKET_AGENT_BASE_URL": "--base-url",
    "DOCKET_AGENT_TEMPERATURE": "--temperature",
}
# A sampling temperature as the agent sends it: 0 to 2 (OpenAI's range; Anthropic's is
# 0 to 1, and a provider that refuses a value says so in its answer), two decimals at most.
_TEMPERATURE = re.compile(r"[0-2](\.[0-9]{1,2})?\Z", re.ASCII)
# The retry budget's share: 0 to 1 with three decimals at most, or a percentage (10%).
_RATIO = re.compile(r"(0(\.[0-9]{1,3})?|1(\.0{1,3})?)\Z", re.ASCII)
_PERCENT = re.compile(r"([0-9]{1,2}(\.[0-9])?|100)%\Z", re.ASCII)
DEFAULT_DEADLINE_S = 120.0  # one logical call, all its attempts and waits: two full timeouts


@dataclass(frozen=True)
class AgentConfig:
    provider: str
    base_url: str
    api_key: str
    boundary_url: str | None
    mode: str
    calls: int
    concurrency: int
    model: str
    max_tokens: int
    timeout: float
    seed: int
    policy: BackoffPolicy
    # backoff mode: one deadline per logical call, and the run's retry budget
    deadline: float = DEFAULT_DEADLINE_S
    retry_ratio: Fraction = DEFAULT_RATIO
    retry_floor: int = DEFAULT_FLOOR
    # None: the body carries no temperature (the provider's default, 1), as it always
    # did; a number is sent as given, e.g. 0 for the greedy calls a [cache] may serve.
    temperature: int | float | None = None

    @property
    def endpoint(self) -> str:
        # The SDKs' conventions: OpenAI's base URL includes /v1, Anthropic's does not.
        root = self.base_url.rstrip("/")
        return root + ("/chat/completions" if self.provider == "openai" else "/v1/messages")

    def auth_headers(self) -> dict[str, str]:
        if self.provider == "openai":
            return {"authorization": f"Bearer {self.api_key}"}
        return {"x-api-key": self.api_key, "anthropic-version": ANTHROPIC_VERSION}


class _Settings:
    """The environment with flag overrides, naming where a bad value came from.

    Settings are text (a variable, a flag): they are read by docket.fields in text
    mode, the same checks and wording as the policy's, by the text forms of
    docket.values' grammars (30, 30s, 500ms, 1h; ASCII digits)."""

    def __init__(self, env: Mapping[str, str], overrides: Mapping[str, str | None]):
        self._env = env
        self._overrides = {k: v for k, v in overrides.items() if v is not None}
        merged = {**env, **self._overrides}
        given = {name: self.get(name) for name in merged}
        self.fields = Fields(
            {name: value for name, value in given.items() if value is not None},
            self.bad,
            text=True,
        )

    def get(self, name: str) -> str | None:
        value = self._overrides.get(name, self._env.get(name))
        return None if value is None or value.strip() == "" else value.strip()

    def where(self, name: str) -> str:
        return FLAGS.get(name, name) if name in self._overrides else name

    def bad(self, name: str, problem: str) -> InputError:
        return InputError(f"agent: {self.where(name)}={self.get(name)!r}: {problem}")

    def positive_int(self, name: str, default: int) -> int:
        return self.fields.integer(name, default, minimum=1)

    def seconds(self, name: str, default: float) -> float:
        return self.fields.duration(name, default)  # above zero, at most ten years


def _check_url(settings: _Settings, name: str, url: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise settings.bad(name, f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise settings.bad(name, "not an http(s) URL with a host")
    return url


def _temperature(s: _Settings) -> int | float | None:
    text = s.get("DOCKET_AGENT_TEMPERATURE")
    if text is None:
        return None
    if not _TEMPERATURE.match(text) or float(text) > 2:
        raise s.bad("DOCKET_AGENT_TEMPERATURE", "must be a number from 0 to 2 (e.g. 0, 0.7)")
    value = float(text)
    return int(value) if value.is_integer() else value  # "0" is sent as 0, not 0.0


def _retry_ratio(s: _Settings) -> Fraction:
    text = s.get("DOCKET_AGENT_RETRY_RATIO")
    if text is None:
        return DEFAULT_RATIO
    if _RATIO.match(text):
        return ratio_from(Fraction(text))
    if _PERCENT.match(text):
        return ratio_from(Fraction(text[:-1]) / 100)
    raise s.bad(
        "DOCKET_AGENT_RETRY_RATIO", "must be a share from 0 to 1 (e.g. 0.1) or a percentage (10%)"
    )


def config_from(
    env: Mapping[str, str], overrides: Mapping[str, str | None] | None = None
) -> AgentConfig:
    """Read and check every setting; a bad one is an InputError naming it (exit 2)."""
    s = _Settings(env, overrides or {})
    provider = (s.get("DOCKET_AGENT_PROVIDER") or "openai").lower()
    if provider not in PROVIDERS:
        raise s.bad("DOCKET_AGENT_PROVIDER", f"not one of {', '.join(PROVIDERS)}")
    mode = (s.get("DOCKET_AGENT_MODE") or "once").lower()
    if mode not in MODES:
        raise s.bad("DOCKET_AGENT_MODE", f"not one of {', '.join(MODES)}")

    prefix = provider.upper()
    url_name = "DOCKET_AGENT_BASE_URL" if s.get("DOCKET_AGENT_BASE_URL") else f"{prefix}_BASE_URL"
    base_url = s.get(url_name)
    if base_url is None:
        example = "/openai/v1" if provider == "openai" else "/anthropic"
        raise InputError(
            f"agent: {prefix}_BASE_URL is not set: point it at the boundary"
            f" (http://127.0.0.1:PORT{example}) or pass --base-url"
        )
    base_url = _check_url(s, url_name, base_url)
    api_key = s.get(f"{prefix}_API_KEY")
    if api_key is None:
        raise InputError(
            f"agent: {prefix}_API_KEY is not set (the per-run token the supervisor gives the agent)"
        )
    boundary_url = s.get("DOCKET_BOUNDARY_URL")
    if boundary_url is not None:
        boundary_url = _check_url(s, "DOCKET_BOUNDARY_URL", boundary_url)

    seed_text = s.get("DOCKET_AGENT_SEED")
    if seed_text is None:
        seed = secrets.randbits(32)  # printed in the summary, so the run can be replayed
    else:
        try:
            seed = parse_whole(seed_text, max_digits=20)
        except ValueProblem as exc:
            raise s.bad("DOCKET_AGENT_SEED", exc.reason) from None
    calls = s.positive_int("DOCKET_AGENT_CALLS", 10)  # checked in every mode: bad is bad
    try:
        policy = BackoffPolicy(
            base=s.seconds("DOCKET_AGENT_BACKOFF_BASE", 0.1),
            cap=s.seconds("DOCKET_AGENT_BACKOFF_CAP", 5.0),
            max_attempts=s.positive_int("DOCKET_AGENT_MAX_ATTEMPTS", 8),
            max_hint=s.seconds("DOCKET_AGENT_MAX_RETRY_AFTER", 60.0),
        )
    except ValueError as exc:  # every field is checked above; this is the policy's own word
        raise InputError(f"agent: backoff policy: {exc}") from None
    return AgentConfig(
        temperature=_temperature(s),
        provider=provider,
        base_url=base_url,
        api_key=api_key,
        boundary_url=boundary_url,
        mode=mode,
        calls=1 if mode in ("once", "stream") else calls,
        concurrency=s.positive_int("DOCKET_AGENT_CONCURRENCY", 4),
        model=s.get("DOCKET_AGENT_MODEL") or DEFAULT_MODELS[provider],
        max_tokens=s.positive_int("DOCKET_AGENT_MAX_TOKENS", 16),
        timeout=s.seconds("DOCKET_AGENT_TIMEOUT", 60.0),
        seed=seed,
        policy=policy,
        deadline=s.seconds("DOCKET_AGENT_DEADLINE", DEFAULT_DEADLINE_S),
        retry_ratio=_retry_ratio(s),
        retry_floor=s.fields.integer(
            "DOCKET_AGENT_RETRY_FLOOR", DEFAULT_FLOOR, minimum=0, maximum=1_000_000
        ),
    )
