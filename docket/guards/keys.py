"""The provider keys at start: which the agent must not see, which are unusable.

Pure: an environment and a policy in, names and problems out; the supervisor
acts on them (docket.run.child.child_env drops, `docket run` warns or
refuses). The agent is given a per-run token, never a key, so its environment
loses every configured provider's `key_env`, the well-known provider key names
below (a key for a provider the policy does not configure is still a key), and
any name the policy adds under `[secrets] drop_env`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Environment variables that model providers' SDKs and common agent tooling read
# an API key or token from. Not exhaustive (a policy names more in secrets.drop_env);
# every name here is a credential for a model API and nothing else.
WELL_KNOWN_KEY_ENV = (
    "OPENAI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GENERATIVE_AI_API_KEY",
    "MISTRAL_API_KEY",
    "CODESTRAL_API_KEY",
    "COHERE_API_KEY",
    "CO_API_KEY",
    "GROQ_API_KEY",
    "TOGETHER_API_KEY",
    "TOGETHERAI_API_KEY",
    "FIREWORKS_API_KEY",
    "DEEPSEEK_API_KEY",
    "XAI_API_KEY",
    "PERPLEXITY_API_KEY",
    "PPLX_API_KEY",
    "OPENROUTER_API_KEY",
    "CEREBRAS_API_KEY",
    "DEEPINFRA_API_KEY",
    "DEEPINFRA_API_TOKEN",
    "AI21_API_KEY",
    "VOYAGE_API_KEY",
    "REPLICATE_API_TOKEN",
    "HF_TOKEN",
    "HUGGINGFACE_API_KEY",
    "HUGGING_FACE_HUB_TOKEN",
    "NVIDIA_API_KEY",
    "SAMBANOVA_API_KEY",
    "MOONSHOT_API_KEY",
    "DASHSCOPE_API_KEY",
    "ANYSCALE_API_KEY",
)


def agent_drops(policy) -> frozenset[str]:
    """Every variable name the agent's environment must not carry."""
    configured = {p.key_env for p in policy.providers.values()}
    if policy.export.otlp_headers_env:  # a collector's token, for the run's end only
        configured.add(policy.export.otlp_headers_env)
    if policy.fleet.dsn_env:  # the budget's database
        configured.add(policy.fleet.dsn_env)
    return frozenset(WELL_KNOWN_KEY_ENV) | configured | frozenset(policy.secrets.drop_env)


@dataclass(frozen=True)
class MissingKey:
    provider: str
    key_env: str

    def as_dict(self) -> dict:
        return {"provider": self.provider, "key_env": self.key_env}


def key_problem(value: str) -> str | None:
    """Why a key cannot go into an HTTP header, or None. The value is never quoted."""
    if "\r" in value or "\n" in value:
        return "holds a line break (CR or LF)"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return "holds a control character"
    if not value.isascii():
        return "holds a character that is not ASCII"
    return None


def missing_keys(env, policy) -> tuple[MissingKey, ...]:
    """The configured providers whose key_env is unset or empty, in policy order."""
    return tuple(
        MissingKey(name, p.key_env)
        for name, p in policy.providers.items()
        if not env.get(p.key_env)
    )


def bad_keys(env, policy) -> tuple[tuple[str, str], ...]:
    """(key_env, why) for each configured key that is set but unusable."""
    out = {}
    for p in policy.providers.values():
        value = env.get(p.key_env)
        problem = None if not value else key_problem(value)
        if problem is not None:
            out[p.key_env] = problem
    return tuple(out.items())


def missing_warning(missing: tuple[MissingKey, ...]) -> str:
    """The one warning line `docket run` prints at start."""
    named = ", ".join(f"{m.key_env} (provider {m.provider})" for m in missing)
    return f"docket: warning: no provider key in {named}: its calls go upstream without a key"
