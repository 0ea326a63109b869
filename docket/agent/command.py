"""The reference agent: a small model client that drives the boundary on purpose.

Tests, chaos runs and game days need an agent whose behaviour is known: one
call, a runaway loop, a hammer, a polite client that backs off, a streamed call.
It reads the environment a supervisor gives an agent (flags override it):

  OPENAI_BASE_URL, OPENAI_API_KEY        the boundary's OpenAI door and the per-run token
  ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY  the same, with DOCKET_AGENT_PROVIDER=anthropic
  DOCKET_BOUNDARY_URL                    the boundary's root, where backoff waits are reported
  DOCKET_AGENT_MODE                      once | stream | loop | hammer | backoff | repeat
                                         (default once)
  DOCKET_AGENT_CALLS                     calls for loop, hammer, backoff, repeat (default 10)
  DOCKET_AGENT_CONCURRENCY               hammer's concurrent workers (default 4)
  DOCKET_AGENT_MODEL, DOCKET_AGENT_MAX_TOKENS, DOCKET_AGENT_TIMEOUT (seconds per call)
  DOCKET_AGENT_SEED                      the jitter's random seed (default: drawn, and printed)
  DOCKET_AGENT_BACKOFF_BASE, DOCKET_AGENT_BACKOFF_CAP, DOCKET_AGENT_MAX_ATTEMPTS,
  DOCKET_AGENT_MAX_RETRY_AFTER           the backoff policy (docket.agent.backoff.BackoffPolicy)
  DOCKET_AGENT_DEADLINE                  backoff: seconds one call may take, all its attempts
                                         and waits included (default 120)
  DOCKET_AGENT_RETRY_RATIO, DOCKET_AGENT_RETRY_FLOOR
                                         backoff: the retry budget, retries <= ratio * first
                                         attempts + floor (default 0.1 and 3;
                                         docket.agent.budget.RetryBudget)
  DOCKET_AGENT_BASE_URL                  (or --base-url) instead of the provider's base URL
  DOCKET_AGENT_TEMPERATURE               sent as the body's temperature (0 to 2); unset, the
                                         body has none (the provider's default)

It ends with one JSON line on stdout (calls, ok, refusals by status, waited
seconds, errors by kind; stream adds ttfb_s, total_s and events). A refusal is
an expected outcome of loop, hammer, backoff and repeat, so those exit 0 once they ran;
they exit 1 only if no call got an HTTP answer at all. once and stream exit 1
unless their call succeeded. loop and backoff stop at a docket_policy_denied
refusal (a cap ends a runaway loop), and so does repeat; hammer counts refusals
and goes on.

SIGTERM or SIGINT (a supervisor stopping the run: a cap kill, a full ledger,
Ctrl-C) stops the agent: it makes no further call, abandons those in flight
(counted as `interrupted` once their request was sent in full, so the boundary
has it; as `unsent` if the signal came while it was still being written), prints
its summary with `"stopped": "sigterm"` (or "sigint") and exits 128 + the signal
(143, 130), as a process killed by it would: the mode did not finish, and the
summary is what it did until then. A signal that arrives while Python is still
starting, before the handler is in place, kills it without a summary.

The agent deliberately uses raw HTTP, not the provider SDKs: the SDKs retry on
their own, and a reference agent whose retries are hidden cannot be the client
half of a game day. The decisions (what an answer means, how long to back off)
are pure; the trio part only sends, reads and sleeps. The parts:

  docket.agent.config   environment + flags -> a frozen AgentConfig (one-line errors)
  docket.agent.calls    the body sent, and what an answer or a stream means (Outcome)
  docket.agent.report   the running Tally, the summary line and the verdict
  docket.agent.modes    Agent: the trio part that sends, reads and sleeps, one method a mode
  docket.agent.backoff  the retry policy: full-jitter waits, Retry-After honoured
  docket.agent.budget   the retry budget: a run's retries within a share of its calls
  docket.agent.command  this module: the client, the stop signals, `docket agent` itself
Each name is imported from the module that defines it.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Mapping
from functools import partial
from typing import TextIO

from docket.agent.config import (
    AgentConfig,
    config_from,
)
from docket.agent.modes import Agent
from docket.agent.report import STOP_SIGNALS, verdict
from docket.errors import CheckFailed


async def run_agent(
    config: AgentConfig, err: TextIO = sys.stderr, *, early_signals: list[int] | None = None
) -> dict:
    """Run the configured mode to its end, or until SIGTERM/SIGINT; return the summary.

    `early_signals` holds stop signals caught before this ran (agent_command
    catches them from its first instant): the agent then stops at once.
    """
    import httpx
    import trio

    timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0))
    limits = httpx.Limits(max_connections=config.concurrency + 1)  # +1: the backoff reports
    started = trio.current_time()
    # trust_env=False: an HTTP(S)_PROXY meant for the agent's other traffic must not
    # route its model calls somewhere other than the base URL it was given.
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        agent = Agent(config, client, err)
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                if early_signals:
                    agent.stop(early_signals[0])
                    nursery.cancel_scope.cancel()
                nursery.start_soon(_stop_on_signal, agent, signals, nursery.cancel_scope)
                await getattr(agent, config.mode)()
                nursery.cancel_scope.cancel()  # the mode is done: stop listening
    summary = agent.tally.summary(config, trio.current_time() - started)
    summary.update(agent.stream_timing)
    return summary


async def _stop_on_signal(agent: Agent, signals, mode_scope) -> None:
    async for signum in signals:
        agent.stop(signum)
        mode_scope.cancel()
        return


def agent_command(overrides: Mapping[str, str | None], env: Mapping[str, str] | None = None) -> int:
    """`docket agent`: run, print the summary line, and exit by the mode's verdict."""
    # Caught from here on, so a stop that comes while the agent starts still
    # gets its summary; run_agent's signal receiver takes over from these.
    early: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _: early.append(signum)) for sig in STOP_SIGNALS
    }
    import os

    import trio

    try:
        config = config_from(os.environ if env is None else env, overrides)
        summary = trio.run(partial(run_agent, config, early_signals=early))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(json.dumps(summary), flush=True)
    if summary["stopped"] in STOP_SIGNALS.values():
        stopped_by = next(s for s, name in STOP_SIGNALS.items() if name == summary["stopped"])
        return 128 + stopped_by
    problem = verdict(config, summary)
    if problem is not None:
        raise CheckFailed(f"agent: {problem}")
    return 0
