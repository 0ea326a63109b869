"""`docket export otel` and [export]: what reaches a real OTLP/HTTP receiver (a server on
127.0.0.1 decoding the protobuf with opentelemetry-proto's classes), checked span by
span, attribute by attribute, against the ledger read from disk: the session's game-day
ledgers (breaker, faults, refusals, caps, kills) and a real `docket run` of the
reference agent over a stub, whose policy exports when the run ends."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from otlp_receiver import attributes, otlp_receiver

from docket.cli import main
from docket.errors import InputError
from docket.export.otel_fold import (
    MAX_ROOT_EVENTS,
    ROOT_EVENT_MEMBERS,
    RunFold,
    span_id_of,
    trace_id_of,
)
from docket.guards.keys import agent_drops
from docket.policy import Policy, PolicyError, policy_from_dict
from docket.reading.source import read_events

pytest.importorskip("opentelemetry.proto")  # the test extra installs it

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3
STATUS_ERROR = 2
OPERATIONS = {"chat.completions": ("chat", "openai"), "messages": ("chat", "anthropic")}
DEADLINE = 90  # a supervised run on a shared 2-core machine


def ledger_lines(path: Path) -> tuple[list[dict], list[str]]:
    lines = path.read_bytes().split(b"\n")[:-1]
    return [json.loads(x) for x in lines], [hashlib.sha256(x).hexdigest() for x in lines]


def ns(ts: str) -> int:
    return (datetime.fromisoformat(ts) - EPOCH) // timedelta(microseconds=1) * 1000


def is_readable(path: Path) -> bool:
    try:
        for _ in read_events(path):
            pass
    except InputError:
        return False
    return True


def export(path: Path, url: str, *extra: str) -> int:
    return main(["export", "otel", str(path), "--endpoint", url, "--timeout", "5", *extra])


def check_against_ledger(path: Path, got) -> None:
    """Every span, parent, name, time and attribute the receiver decoded, against the
    ledger's own lines."""
    events, hashes = ledger_lines(path)
    start = events[0]
    anchor = ns(start["ts"]) - start["mono_ms"] * 1_000_000
    spans = got.spans()
    (root,) = [s for s in spans if not s.parent_span_id]
    run_id = start["run_id"]
    assert root.trace_id == trace_id_of(run_id).to_bytes(16, "big")
    assert root.span_id == span_id_of(run_id, "run").to_bytes(8, "big")
    assert {s.trace_id for s in spans} == {root.trace_id}
    top = attributes(root.attributes)
    assert root.kind == SPAN_KIND_INTERNAL
    assert top["gen_ai.operation.name"] == "invoke_agent"
    assert top["docket.run_id"] == run_id and top["docket.line_sha256"] == hashes[0]
    assert top["docket.argv"] == start["argv"]
    assert root.name == "invoke_agent " + start["argv"][0].rsplit("/", 1)[-1]
    assert root.start_time_unix_nano == anchor + start["mono_ms"] * 1_000_000
    assert root.end_time_unix_nano == anchor + events[-1]["mono_ms"] * 1_000_000
    assert top["docket.ledger.events"] == len(events)
    assert top["docket.ledger.head"] == hashes[-1]
    end = events[-1]
    if end["type"] == "session.end":
        assert top["docket.exit.reason"] == end["reason"]
        assert top.get("docket.exit.status") == end.get("exit_status")
        assert top.get("docket.exit.cap") == end.get("cap")
        failed = end.get("cap") is not None or end.get("exit_status") not in (0, None)
        assert (root.status.code == STATUS_ERROR) == failed

    calls = {s.span_id: s for s in spans if s.parent_span_id}
    by_seq = {attributes(s.attributes)["docket.seq"]: s for s in calls.values()}
    requests = [e for e in events if e["type"] == "model.request"]
    assert sorted(by_seq) == [r["seq"] for r in requests]
    closers = {
        e.get("call_id"): e for e in events if e["type"] in ("model.response", "model.error")
    }
    tokens = {"input": 0, "output": 0}
    closed = 0
    for r in requests:
        span = by_seq[r["seq"]]
        a = attributes(span.attributes)
        operation, provider = OPERATIONS[r["endpoint"]]
        assert span.parent_span_id == root.span_id and span.kind == SPAN_KIND_CLIENT
        assert span.span_id == span_id_of(run_id, r["seq"]).to_bytes(8, "big")
        assert span.name == f"{operation} {r['model']}"
        assert a["gen_ai.operation.name"] == operation
        assert a["gen_ai.provider.name"] == provider
        assert a["gen_ai.request.model"] == r["model"]
        assert a["gen_ai.request.stream"] == r["stream"]
        assert a.get("gen_ai.request.max_tokens") == r.get("max_output_tokens")
        assert a.get("docket.client_attempt") == r.get("client_attempt")
        assert a["docket.line_sha256"] == hashes[r["seq"]]
        assert a["docket.call_id"] == r["call_id"]
        assert span.start_time_unix_nano == anchor + r["mono_ms"] * 1_000_000
        closing = closers.get(r["call_id"])
        if closing is None:  # the ledger never said how it ended
            assert a["error.type"] == "docket.unclosed" and span.status.code == STATUS_ERROR
            assert span.end_time_unix_nano == root.end_time_unix_nano
            continue
        closed += 1
        assert span.end_time_unix_nano == anchor + closing["mono_ms"] * 1_000_000
        assert a["docket.end_seq"] == closing["seq"]
        assert a["docket.end_line_sha256"] == hashes[closing["seq"]]
        assert a["gen_ai.response.model"] == closing["model"]
        assert a["docket.cost.nusd"] == closing["cost_nusd"]
        assert a["docket.cost.usd"] == pytest.approx(closing["cost_nusd"] / 1e9)
        usage = closing.get("usage") or {}
        for member, name in (("input_tokens", "input"), ("output_tokens", "output")):
            assert a.get(f"gen_ai.usage.{member}") == usage.get(member)
            tokens[name] += usage.get(member) or 0
        assert a.get("gen_ai.usage.cache_read.input_tokens") == usage.get("cached_tokens")
        status = closing.get("status")
        assert a.get("http.response.status_code") == status
        if closing["type"] == "model.error" or (status or 0) >= 400:
            expected = str(status) if (status or 0) >= 400 else closing["reason"]
            assert a["error.type"] == expected and span.status.code == STATUS_ERROR
        else:
            assert "error.type" not in a and span.status.code != STATUS_ERROR

    opened = {r["call_id"] for r in requests}
    on_root = [
        e
        for e in events
        if e["type"] in ROOT_EVENT_MEMBERS
        and not (e["type"] == "model.error" and e.get("call_id") in opened)
    ]
    assert len(root.events) == min(len(on_root), MAX_ROOT_EVENTS)
    for event, said in zip(on_root, root.events, strict=False):
        a = attributes(said.attributes)
        assert said.name == event["type"]
        assert said.time_unix_nano == anchor + event["mono_ms"] * 1_000_000
        assert (a["docket.seq"], a["docket.line_sha256"]) == (event["seq"], hashes[event["seq"]])
        for member in ("rule", "reason", "cap", "fault", "from", "to", "client_attempt"):
            if isinstance(event.get(member), str | int):
                assert a[f"docket.{member}"] == event[member], (event["type"], member)

    histograms = got.histograms()
    usage_points = histograms.get("gen_ai.client.token.usage", [])
    for name, total in tokens.items():
        points = [p for p in usage_points if attributes(p.attributes)["gen_ai.token.type"] == name]
        assert sum(p.sum for p in points) == total
    durations = histograms.get("gen_ai.client.operation.duration", [])
    assert sum(p.count for p in durations) == closed


def gameday_ledgers(keep: Path) -> list[Path]:
    return sorted(keep.rglob("ledger.jsonl"))


def test_each_game_day_ledger_is_exported_as_it_reads_or_refused(gameday_run):
    ledgers = gameday_ledgers(gameday_run.keep)
    assert len(ledgers) >= 9, gameday_run.output[-2000:]
    exported = refused = 0
    seen_types: set[str] = set()
    for path in ledgers:
        with otlp_receiver() as (url, got):
            code = export(path, url)
        if is_readable(path):
            assert code == 0, path
            check_against_ledger(path, got)
            seen_types |= {e["type"] for e in ledger_lines(path)[0]}
            exported += 1
        else:  # a torn or killed ledger: refused whole, nothing sent
            assert code == 2 and not got.traces and not got.metrics, path
            refused += 1
    assert exported >= 8
    # The day covers what the export maps (else the checks above checked little).
    wanted = {"breaker.state", "x-docket.breaker-open", "fault.injected", "cap.exceeded"}
    assert wanted <= seen_types, wanted - seen_types
    assert {"x-docket.rate-limited", "load.shed", "cap.warning"} & seen_types


def test_exporting_twice_gives_the_same_ids_and_attributes(gameday_run):
    path = next(p for p in gameday_ledgers(gameday_run.keep) if "circuit-breaker" in str(p))
    sent = []
    for _ in range(2):
        with otlp_receiver() as (url, got):
            assert export(path, url, "--header", "x-team=red") == 0
        sent.append(
            sorted(
                (s.trace_id, s.span_id, s.parent_span_id, s.SerializeToString())
                for s in got.spans()
            )
        )
        assert all(h.get("x-team") == "red" for h in got.headers)
        assert all(h["content-type"] == "application/x-protobuf" for h in got.headers)
    assert sent[0] == sent[1] and len(sent[0]) > 1


def test_a_broken_ledger_is_refused_in_one_line_and_nothing_is_sent(gameday_run, tmp_path, capsys):
    path = next(p for p in gameday_ledgers(gameday_run.keep) if "circuit-breaker" in str(p))
    lines = path.read_bytes().split(b"\n")
    lines[4] = lines[4].replace(b"gpt-4o-mini", b"gpt-4o-maxi")  # a well-formed edit
    broken = tmp_path / "ledger.jsonl"
    broken.write_bytes(b"\n".join(lines))
    with otlp_receiver() as (url, got):
        assert export(broken, url) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chain_break at seq 5" in err
    assert not got.traces and not got.metrics and not got.headers


def test_an_unreachable_endpoint_is_one_line_and_exit_1(gameday_run, capsys):
    path = next(p for p in gameday_ledgers(gameday_run.keep) if "circuit-breaker" in str(p))
    with otlp_receiver() as (url, _):
        pass  # the port is free again: nothing listens there now
    assert main(["export", "otel", str(path), "--endpoint", url, "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not take the run" in err and "refused" in err


def test_an_endpoint_that_answers_an_error_is_exit_1(gameday_run, capsys):
    path = next(p for p in gameday_ledgers(gameday_run.keep) if "circuit-breaker" in str(p))
    with otlp_receiver() as (url, got):
        got.status = 400  # not retried: one request
        assert export(path, url) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "400" in err and len(got.headers) == 1


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--endpoint", "ftp://collector"], "must be an http:// or https:// URL"),
        (["--header", "novalue"], "--header: want KEY=VALUE"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(gameday_run, argv, problem, capsys):
    path = next(p for p in gameday_ledgers(gameday_run.keep) if "circuit-breaker" in str(p))
    assert main(["export", "otel", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err


# ---------------------------------------------------------------- the fold's bounds


def test_a_flood_of_refusals_keeps_a_bounded_number_of_span_events():
    fold = RunFold()
    start = {"v": 1, "seq": 0, "ts": "2026-12-02T10:00:00.000Z", "mono_ms": 0}
    fold.add({**start, "type": "session.start", "run_id": "r"}, "0" * 64)
    for seq in range(1, MAX_ROOT_EVENTS + 11):
        refusal = {**start, "seq": seq, "mono_ms": seq, "type": "load.shed", "rule": "x"}
        assert fold.add(refusal, "1" * 64) == ([], [])
    root, unclosed = fold.finish()
    assert len(root.events) == MAX_ROOT_EVENTS and not unclosed
    assert root.attributes["docket.span_events_dropped"] == 10


# A run as the fold sees it: calls opened, closed (ok or failed), refusals between.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.integers(0, 30)),
        st.tuples(st.just("close"), st.integers(0, 30), st.booleans()),
        st.tuples(st.just("refuse"), st.sampled_from(sorted(ROOT_EVENT_MEMBERS))),
    ),
    max_size=80,
)


@given(steps=STEPS, gaps=st.lists(st.integers(0, 5000), min_size=81, max_size=81))
def test_the_fold_gives_each_call_one_span_inside_the_run(steps, gaps):
    fold = RunFold()
    mono, seq = 0, 0
    fold.add({"v": 1, "seq": 0, "ts": "2026-12-02T10:00:00.000Z", "mono_ms": 0,
              "type": "session.start", "run_id": "prop"}, "0" * 64)  # fmt: skip
    opened: set[str] = set()
    requests: dict[str, int] = {}
    spans = []
    for step, gap in zip(steps, gaps, strict=False):
        seq, mono = seq + 1, mono + gap
        common = {"v": 1, "seq": seq, "ts": "x", "mono_ms": mono}
        if step[0] == "open" and f"c{step[1]}" not in requests:
            call = f"c{step[1]}"
            event = {**common, "type": "model.request", "call_id": call, "model": "m",
                     "endpoint": "chat.completions", "stream": False}  # fmt: skip
            requests[call] = seq
            opened.add(call)
        elif step[0] == "close":
            event = {**common, "type": "model.response" if step[2] else "model.error",
                     "call_id": f"c{step[1]}", "model": "m", "status": 200 if step[2] else 503,
                     "usage": {"input_tokens": 3, "output_tokens": 4}, "cost_nusd": 7}  # fmt: skip
            opened.discard(f"c{step[1]}")
        else:
            event = {**common, "type": step[1] if step[0] == "refuse" else "agent.backoff"}
        closed, measured = fold.add(event, f"{seq:064x}")
        spans += closed
        for span in closed:  # a span per close, each with one duration value
            assert [m.value for m in measured if m.metric.endswith("duration")] == [
                (span.end_ns - span.start_ns) / 1e9
            ]
    root, unclosed = fold.finish()
    spans += unclosed
    assert sorted(s.attributes["docket.seq"] for s in spans) == sorted(requests.values())
    assert len({s.span_id for s in spans} | {root.span_id}) == len(spans) + 1
    assert {s.attributes["docket.call_id"] for s in unclosed} == opened
    for span in spans:
        assert span.parent_id == root.span_id
        assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns
        assert (span.error is not None) == ("error.type" in span.attributes)


def test_a_ts_that_is_not_a_time_is_one_line():
    with pytest.raises(InputError, match="seq 0's ts is not an RFC 3339 time"):
        RunFold().add(
            {"v": 1, "seq": 0, "ts": "yesterday", "mono_ms": 0, "type": "session.start"}, "0" * 64
        )


# ---------------------------------------------------------------- [export] in the policy


def test_the_export_table_is_checked_and_kept_out_of_the_digest():
    p = policy_from_dict(
        {"export": {"otlp_endpoint": "http://127.0.0.1:4318", "otlp_headers_env": "OTLP_HDRS"}}
    )
    assert p.export.otlp_endpoint == "http://127.0.0.1:4318" and p.export.otlp_timeout == 10.0
    assert p.digest() == Policy().digest()
    assert "OTLP_HDRS" in agent_drops(p)  # a collector's token never reaches the agent
    for table, problem in (
        ({"otlp_endpoint": "collector:4318"}, "export.otlp_endpoint: must be an http://"),
        ({"otlp_headers_env": "MY TOKEN"}, "export.otlp_headers_env"),
        ({"otlp_timeout": -1}, "export.otlp_timeout"),
        ({"otlp_headers": "Authorization=x"}, "export.otlp_headers"),  # no secret in the file
    ):
        with pytest.raises(PolicyError, match=problem) as info:
            policy_from_dict({"export": table})
        assert "\n" not in str(info.value)


AGENT = [sys.executable, "-m", "docket", "agent", "--mode", "loop", "--calls", "2"]


async def supervised_run(tmp_path: Path, stub_url: str, endpoint: str) -> trio.CompletedProcess:
    policy = tmp_path / "docket.toml"
    policy.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "{stub_url}"\nkey_env = "STUB_KEY"\n'
        f'[export]\notlp_endpoint = "{endpoint}"\notlp_headers_env = "OTLP_HDRS"\n'
        'otlp_timeout = "1s"\n'
    )
    argv = [sys.executable, "-m", "docket", "run", "--policy", str(policy),
            "--ledger-dir", str(tmp_path / "run"), "--", *AGENT]  # fmt: skip
    env = {**os.environ, "STUB_KEY": "sk-stub-export", "OTLP_HDRS": "x-team=red,x-env=ci%20run"}
    return await trio.run_process(argv, capture_stdout=True, capture_stderr=True, env=env)


async def test_a_run_exports_its_record_when_it_ends(stub_server, tmp_path):
    with trio.fail_after(DEADLINE), otlp_receiver() as (url, got):
        async with stub_server("openai") as stub:
            done = await supervised_run(tmp_path, stub.url, url)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "exported run" in err and f"to {url}" in err
    assert all(h.get("x-team") == "red" and h.get("x-env") == "ci run" for h in got.headers)
    ledger = tmp_path / "run" / "ledger.jsonl"
    check_against_ledger(ledger, got)
    host, port = stub.url.split("//")[1].split(":")
    for span in got.spans():
        a = attributes(span.attributes)
        if span.parent_span_id:  # the policy names where the provider lives
            assert (a["server.address"], a["server.port"]) == (host, int(port))


async def test_a_failed_export_at_the_run_end_changes_no_exit_code(stub_server, tmp_path):
    with otlp_receiver() as (url, _):
        pass  # nothing listens there any more
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as stub:
            done = await supervised_run(tmp_path, stub.url, url)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    warnings = [line for line in err.splitlines() if "export to" in line]
    assert len(warnings) == 1 and "failed" in warnings[0] and "refused" in warnings[0]
    assert (tmp_path / "run" / "receipt.json").exists()


def test_no_metrics_sends_the_trace_only(gameday_run):
    path = next(p for p in gameday_ledgers(gameday_run.keep) if "circuit-breaker" in str(p))
    with otlp_receiver() as (url, got):
        assert export(path, url, "--no-metrics") == 0
    assert got.spans() and not got.metrics
    assert {h["path"] for h in got.headers} == {"/v1/traces"}
