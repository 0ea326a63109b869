"""Assertions: a JMESPath query over the evidence, and one comparison with a written value.

Pure: `evaluate(assertion, evidence)` takes the evidence (plain JSON values) and
returns a Check whose verdict is pass, fail or unknown. Unknown is never a pass:
a query that raises, or yields null (or a value of the wrong type) where the
comparison needs a value, could not be evaluated, and the check says why.

Comparisons are JSON's, not Python's: true is not 1, and 1 equals 1.0. No
comparison is written in code per phase; the YAML names the query, the
operator and the expected value (docs/gamedays.md).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jmespath
import jmespath.exceptions
import jmespath.functions
from jmespath.parser import ParsedResult

PASS = "pass"
FAIL = "fail"
UNKNOWN = "unknown"
VERDICTS = (PASS, FAIL, UNKNOWN)

# How bad each verdict is, for rolling checks up into a phase and a whole game day.
# A fail outranks an unknown: a check that observed a contradicting value is a
# regression found, and one check that could not be judged must not hide it (a
# breaker that never opened used to read as "unknown, exit 2" instead of "fail").
_RANK = {PASS: 0, UNKNOWN: 1, FAIL: 2}

_FUNCTIONS = jmespath.functions.Functions().FUNCTION_TABLE

# What evaluating a query may raise on odd data: jmespath's own errors, and the
# Python errors its interpreter lets through (`'a' < 1` is a TypeError there).
_QUERY_ERRORS = (
    jmespath.exceptions.JMESPathError,
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    RecursionError,
)


class QueryError(ValueError):
    """A query that JMESPath cannot compile, or calls a function it does not have."""


def compile_query(text: str) -> ParsedResult:
    """Compile a JMESPath query, checking function names and argument counts now, not mid-run."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError("a query must be a non-empty JMESPath string")
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"a query is at most {MAX_QUERY_CHARS} characters, this is {len(text)}")
    try:
        parsed = jmespath.compile(text)
    except jmespath.exceptions.JMESPathError as exc:
        # ParseError's str() spans several lines with a caret; the first says what.
        raise QueryError(f"not a JMESPath query: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        # jmespath's parser recurses once per level: "((((...))))" runs out of stack.
        raise QueryError(f"not a JMESPath query: nested more than {MAX_QUERY_DEPTH} deep") from None
    if _depth(parsed.parsed) > MAX_QUERY_DEPTH:
        # Its interpreter recurses the same way: refuse now rather than fail mid-game-day.
        raise QueryError(f"not a JMESPath query: nested more than {MAX_QUERY_DEPTH} deep")
    _check_functions(parsed.parsed)
    return parsed


MAX_QUERY_CHARS = 4096  # the longest query in gamedays/ is under 300
MAX_QUERY_DEPTH = 64  # levels of the parsed tree; real queries use under 10


def _depth(root: dict) -> int:
    """The parsed tree's depth, walked without recursion (the tree may be deep)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in node.get("children", ()) if isinstance(c, dict))
    return deepest


def _check_functions(node: dict) -> None:
    if node.get("type") == "function_expression":
        name = node["value"]
        entry = _FUNCTIONS.get(name)
        if entry is None:
            raise QueryError(f"JMESPath has no function {name}()")
        signature = entry["signature"]
        given = len(node["children"])
        variadic = bool(signature) and signature[-1].get("variadic", False)
        if given < len(signature) or (given > len(signature) and not variadic):
            want = f"at least {len(signature)}" if variadic else str(len(signature))
            raise QueryError(f"{name}() takes {want} argument(s), not {given}")
    for child in node.get("children", ()):
        if isinstance(child, dict):
            _check_functions(child)


# ---------------------------------------------------------------- JSON values


def json_type(value: object) -> str:
    """The JSON type of a plain value: null, boolean, number, string, array, object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def json_equal(a: object, b: object) -> bool:
    """Equality of JSON values: same type, numbers by value, arrays in order, objects by key."""
    ta, tb = json_type(a), json_type(b)
    if ta != tb:
        return False
    # Of one JSON type now: "array" is exactly list | tuple and "object" exactly dict
    # (json_type tests bool, number and string first, which no container is).
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return a == b


def _is_number(value: object) -> bool:
    return json_type(value) == "number" and not (isinstance(value, float) and math.isnan(value))


# ---------------------------------------------------------------- operators


@dataclass(frozen=True)
class Operator:
    name: str
    operand: str  # what the YAML value must be: "any" | "number" | "true" | "array" | "regex"
    needs: str  # what the observed value must be: "value" | "number" | "boolean" | "container" | "string" | "any"
    # Any, not object: holds is called only on values whose JSON types `needs` and
    # `operand` stand for (checked by _observed_problem and operand_problem), a link
    # from a string to a type that the checker cannot follow.
    holds: Callable[[Any, Any], bool]
    shown: str  # how a report writes "observed <shown> expected"


def _contains(observed: str | list | tuple, expected: object) -> bool:
    if isinstance(observed, str):
        return isinstance(expected, str) and expected in observed
    return any(json_equal(item, expected) for item in observed)


OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (
        Operator("equals", "any", "any", json_equal, "=="),
        Operator("not_equals", "any", "value", lambda o, e: not json_equal(o, e), "!="),
        Operator("at_least", "number", "number", lambda o, e: o >= e, ">="),
        Operator("at_most", "number", "number", lambda o, e: o <= e, "<="),
        Operator("greater_than", "number", "number", lambda o, e: o > e, ">"),
        Operator("less_than", "number", "number", lambda o, e: o < e, "<"),
        Operator("is_true", "true", "boolean", lambda o, e: o is True, "is"),
        Operator("is_false", "true", "boolean", lambda o, e: o is False, "is"),
        Operator("contains", "any", "container", _contains, "contains"),
        Operator("not_contains", "any", "container", lambda o, e: not _contains(o, e), "lacks"),
        Operator("one_of", "array", "value", lambda o, e: any(json_equal(o, x) for x in e), "in"),
        Operator("matches", "regex", "string", lambda o, e: re.search(e, o) is not None, "~"),
    )
}


def operand_problem(op: str, value: object) -> str | None:
    """Why `value` cannot be the operand of `op` (None when it can)."""
    operator = OPERATORS[op]
    if operator.operand == "number" and not _is_number(value):
        shown = "NaN" if json_type(value) == "number" else json_type(value)  # YAML's .nan
        return f"{op} needs a number, not {shown}"
    if operator.operand == "true" and value is not True:
        return f"write `{op}: true` (the query's value must be the boolean {op[3:]})"
    if operator.operand == "array" and json_type(value) != "array":
        return f"{op} needs a list of values, not {json_type(value)}"
    if operator.operand == "regex":
        if not isinstance(value, str):
            return f"{op} needs a regular expression string, not {json_type(value)}"
        try:
            re.compile(value)
        except re.error as exc:
            return f"{op}: not a regular expression: {exc}"
    if operator.operand == "any" and json_type(value) not in (
        "null", "boolean", "number", "string", "array", "object"
    ):  # fmt: skip
        return f"{op} needs a JSON value, not {json_type(value)}"
    return None


# ---------------------------------------------------------------- assertions and checks


@dataclass(frozen=True)
class Assertion:
    """One line of a phase's `expect:`: a name, a query, an operator and its operand."""

    name: str
    query: str
    op: str
    expected: object
    compiled: ParsedResult | None = None  # compiled once when the phase file is read

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"unknown operator {self.op!r}")
        problem = operand_problem(self.op, self.expected)
        if problem:
            raise ValueError(problem)
        if self.compiled is None:
            object.__setattr__(self, "compiled", compile_query(self.query))

    @property
    def shown(self) -> str:
        """`query op expected`, as a report prints it."""
        return f"{self.query} {expectation(self.op, self.expected)}"


@dataclass(frozen=True)
class Check:
    """An assertion's verdict, with what was expected and what was observed."""

    name: str
    query: str
    op: str
    expected: object
    observed: object
    verdict: str
    reason: str  # one line: why it failed or is unknown ("" when it passed)
    # The precondition (`requires:`) that failed and so failed this check ("" if none):
    # its own query may have held, so its observed value is not what the verdict says.
    unmet: str = ""

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "query": self.query,
            "op": self.op,
            "expected": self.expected,
            "observed": self.observed,
            "verdict": self.verdict,
            "reason": self.reason,
        }
        if self.unmet:
            out["unmet"] = self.unmet
        return out


def evaluate(assertion: Assertion, evidence: object) -> Check:
    """Run the query over the evidence and compare; never raises for odd evidence."""

    def check(verdict: str, observed: object, reason: str = "") -> Check:
        return Check(
            assertion.name,
            assertion.query,
            assertion.op,
            assertion.expected,
            observed,
            verdict,
            reason,
        )

    # Never None once built: __post_init__ compiles the query when none was given.
    assert assertion.compiled is not None
    try:
        observed = assertion.compiled.search(evidence)
    except _QUERY_ERRORS as exc:
        return check(UNKNOWN, None, f"the query failed: {type(exc).__name__}: {exc}")
    operator = OPERATORS[assertion.op]
    kind = json_type(observed)
    problem = _observed_problem(operator, observed, kind, assertion.expected)
    if problem:
        return check(UNKNOWN, observed, problem)
    try:
        held = operator.holds(observed, assertion.expected)
    except (TypeError, ValueError, re.error) as exc:
        return check(UNKNOWN, observed, f"cannot compare: {exc}")
    if held:
        return check(PASS, observed)
    return check(
        FAIL,
        observed,
        f"observed {brief(observed)}, expected {expectation(assertion.op, assertion.expected)}",
    )


def _observed_problem(operator: Operator, observed: object, kind: str, expected: object) -> str:
    if kind == "null":
        # A null where null was written down is an observation; anywhere else it is a gap.
        if operator.name == "equals" and expected is None:
            return ""
        return "the query yielded null: the evidence has no such value"
    if operator.needs == "number" and not _is_number(observed):
        return f"the query yielded {kind}, not a number"
    if operator.needs == "boolean" and kind != "boolean":
        return f"the query yielded {kind}, not true or false"
    if operator.needs == "container" and kind not in ("array", "string"):
        return f"the query yielded {kind}, not a list or a string"
    if operator.needs == "string" and kind != "string":
        return f"the query yielded {kind}, not a string"
    return ""


def with_preconditions(checks: list[Check], requires: list[tuple[str, ...]]) -> list[Check]:
    """Each check judged again in the light of its preconditions (`requires:`).

    A check whose precondition failed is a fail, whatever its own query said: a
    claim about the open breaker is not shown by a run where it never opened (it
    would pass vacuously). One whose precondition could not be judged is unknown.
    The precondition is a check of its own, so its fail is reported there too.
    Preconditions name earlier checks, so one pass in order settles chains.
    """
    by_name: dict[str, Check] = {}
    out: list[Check] = []
    for check, needs in zip(checks, requires, strict=True):
        failed = [n for n in needs if by_name[n].verdict == FAIL]
        unread = [n for n in needs if by_name[n].verdict == UNKNOWN]
        if failed:
            check = _replace_verdict(
                check, FAIL, f"precondition not met: «{failed[0]}» failed, so this was not shown"
            )
            check = replace(check, unmet=failed[0])
        elif unread and check.verdict != FAIL:
            check = _replace_verdict(
                check, UNKNOWN, f"precondition «{unread[0]}» could not be judged"
            )
        by_name[check.name] = check
        out.append(check)
    return out


def _replace_verdict(check: Check, verdict: str, reason: str) -> Check:
    return replace(check, verdict=verdict, reason=reason)


def worst(verdicts) -> str:
    """The verdict of a group: fail if any fails, else unknown if any is unknown, else pass.

    An empty group has nothing that passed, so it is unknown.
    """
    verdicts = list(verdicts)
    if not verdicts:
        return UNKNOWN
    return max(verdicts, key=_RANK.__getitem__)


def expectation(op: str, expected: object) -> str:
    """What a check expects, in words: `is false` for `is_false: true` (the operand of
    is_true/is_false is always true, so printing it would say "is true" for is_false),
    else the operator's sign and the value (`>= 1`, `== [0, 0]`)."""
    if op in ("is_true", "is_false"):
        return f"is {op[3:]}"
    operator = OPERATORS.get(op)
    return f"{operator.shown if operator else op} {brief(expected)}"


def brief(value: object, limit: int = 120) -> str:
    """A value as short JSON text, for a one-line reason or a report cell."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
