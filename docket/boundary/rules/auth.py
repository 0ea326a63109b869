"""auth: the run's token, sent as the API key.        401 docket_unauthorized"""

from __future__ import annotations

from typing import TYPE_CHECKING

from docket.boundary import providers
from docket.boundary.calls import CallFacts, Fact
from docket.boundary.rules.base import Refusal, Rule, denied

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

FACT: Fact[bool] = Fact("auth")  # the run's token was presented


def check(ok: bool, f: CallFacts) -> Refusal | None:
    if ok:
        return None
    return denied(
        f,
        "auth",
        "docket_unauthorized",
        "this boundary needs the run's token (DOCKET_RUN_TOKEN), sent as the API key",
        own_model=False,
        close=not f.body_complete,
    )


async def learn(host: AdmissionHost, call: Admitting) -> None:
    presented = providers.presented_token(call.request.headers)
    call.facts[FACT] = providers.token_matches(presented, host.token)


RULE = Rule("auth", FACT, check, learn)
