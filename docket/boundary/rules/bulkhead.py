"""bulkhead: bulkhead_trio.Bulkhead.enter.             503 docket_load_shed"""

from __future__ import annotations

from typing import TYPE_CHECKING

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.guarded import Waited
from docket.boundary.providers.client_marks import client_marks
from docket.boundary.rules.base import Refusal, Rule
from docket.guards.bulkhead import DEADLINE
from docket.guards.bulkhead_trio import Entered

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost


FACT: Fact[Entered | Waited | None] = Fact("bulkhead")  # None: no bulkhead


def check(slot: Entered | Waited | None, f: CallFacts) -> Refusal | None:
    if not isinstance(slot, Waited):
        return None
    shed = slot.shed
    fields = shed.fields()
    if slot.waited_s is not None:
        fields["waited_s"] = round(slot.waited_s, 6)  # shed in the queue, not on arrival
    return Refusal(
        rule="deadline" if shed.reason == DEADLINE else "resilience.max_queue",
        error_type="docket_load_shed",
        message=shed.message,
        provider=f.provider,
        model=f.model,
        event=shed.type,
        fields=fields,
        retry_after_s=shed.retry_after_s,
        shed=True,
    )


async def learn(host: AdmissionHost, call: Admitting) -> None:
    assert call.hold is not None  # the deadline rule entered the guards
    # The client's own attempt number (x-stainless-retry-count), as model.request
    # records it: a retry is shed before a first attempt.
    attempt = client_marks(call.request.headers).attempt
    call.facts[FACT] = await call.hold.bulkhead(retry=attempt is not None and attempt > 0)


RULE = Rule("bulkhead", FACT, check, learn)
