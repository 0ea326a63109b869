"""The checks' registry and the loop that runs them: pure bookkeeping, no output.

A check is an async function taking a fresh temporary folder of its own and
returning one line saying what it saw; it fails by raising CheckFailed (what
it expected and what happened instead). Anything else it raises is a failure
too, named by its type and message: nothing a check meets is swallowed. Each
runs under its own deadline, so a mechanism that hangs fails its check rather
than the selftest.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import trio

from docket.errors import one_line

CHECK_DEADLINE_S = 5.0

CheckFn = Callable[[Path], Awaitable[str]]


class CheckFailed(Exception):
    """The mechanism under check did not behave as it must."""


def expect(condition: object, why: str) -> None:
    """Fail the check with `why` unless `condition` holds."""
    if not condition:
        raise CheckFailed(why)


@dataclass(frozen=True)
class Check:
    name: str
    group: str
    what: str  # the property, in a phrase, for the table
    run: CheckFn


@dataclass(frozen=True)
class Result:
    name: str
    group: str
    what: str
    ok: bool
    detail: str
    seconds: float

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "group": self.group,
            "what": self.what,
            "ok": self.ok,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


class Registry:
    """Checks in the order they are declared; `@registry.check(...)` adds one."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.checks: list[Check] = []

    def check(self, name: str, what: str) -> Callable[[CheckFn], CheckFn]:
        def add(fn: CheckFn) -> CheckFn:
            self.checks.append(Check(name, self.group, what, fn))
            return fn

        return add


async def run_one(check: Check, deadline: float = CHECK_DEADLINE_S) -> Result:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"docket-selftest-{check.name}-") as folder:
        try:
            with trio.fail_after(deadline):
                detail = await check.run(Path(folder))
            ok = True
        except CheckFailed as failed:
            ok, detail = False, str(failed)
        except trio.TooSlowError:
            ok, detail = False, f"did not finish within {deadline:g} s"
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, named
            inner = _leaf(exc)
            ok = False
            detail = str(inner) if isinstance(inner, CheckFailed) else _named(inner)
    took = time.monotonic() - started
    return Result(check.name, check.group, check.what, ok, one_line(detail, 300), took)


async def run_all(
    checks: Iterable[Check], on_start: Callable[[Check], None], on_done: Callable[[Result], None]
) -> list[Result]:
    """Run the checks one after another (each owns its sockets and folder)."""
    results = []
    for check in checks:
        on_start(check)
        result = await run_one(check)
        on_done(result)
        results.append(result)
    return results


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested groups of one (a nursery's wrapping), else exc."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
