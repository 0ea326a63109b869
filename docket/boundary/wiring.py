"""The guards built from the policy: the one place that reads both.

The guards (docket/guards/) take plain values (a threshold, a cooldown, a list
of allowed hosts) and never import the policy; the policy validates an egress
entry with the egress guard's own parser (one definition of a valid entry).
So the two depend on each other in one direction only, policy -> guards, and
this module, on the boundary's side, turns a policy's sections into guards.
"""

from __future__ import annotations

from docket.guards.breaker import CircuitBreaker
from docket.guards.bulkhead import BulkheadCore
from docket.guards.egress import EgressRule
from docket.guards.limiter import RateLimiter
from docket.policy import Policy, ResiliencePolicy


def limiter_for(resilience: ResiliencePolicy) -> RateLimiter:
    """The boundary's one limiter (not `enabled` when neither rate is set)."""
    return RateLimiter(resilience.max_calls_per_second, resilience.max_calls_per_minute)


def breaker_for(upstream: str, resilience: ResiliencePolicy) -> CircuitBreaker:
    return CircuitBreaker(
        upstream,
        threshold=resilience.breaker_threshold,
        cooldown=resilience.breaker_cooldown_seconds,
        max_cooldown=resilience.breaker_max_cooldown_seconds,
        failure_rate=resilience.breaker_failure_rate,
        min_calls=resilience.breaker_min_calls,
        window_calls=resilience.breaker_window_calls,
        consecutive_min_calls=resilience.breaker_consecutive_min_calls,
        slow_call_s=(
            None
            if resilience.breaker_slow_call_ms is None
            else resilience.breaker_slow_call_ms / 1000
        ),
        slow_call_rate=resilience.breaker_slow_call_rate,
        half_open_probes=resilience.breaker_half_open_probes,
    )


def bulkhead_core_for(upstream: str, resilience: ResiliencePolicy) -> BulkheadCore | None:
    """None when the policy sets no max_concurrent_upstream (no bulkhead).

    Without max_queue the queue is as long as the slots: a bound is never
    left out, since an unbounded queue turns overload into minutes of latency.
    """
    if resilience.max_concurrent_upstream is None:
        return None
    queue = resilience.max_queue
    return BulkheadCore(
        upstream,
        resilience.max_concurrent_upstream,
        resilience.max_concurrent_upstream if queue is None else queue,
    )


def egress_rule_for(policy: Policy) -> EgressRule:
    """`[egress] allow` plus the configured providers; ValueError for an entry
    the rule cannot use (the policy loader refuses most of them first)."""
    return EgressRule.from_lists(
        policy.egress.allow, {name: p.base_url for name, p in policy.providers.items()}
    )
