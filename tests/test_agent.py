"""The reference agent, run as a real process against a real server on 127.0.0.1.

The server is a small scripted double (http.server in a thread): it answers
each model call as the test says and records what it received and when, so
every assertion is about what reached the wire, not what the agent claims.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from random import Random

import pytest
from helpers import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.agent.backoff import BackoffPolicy
from docket.agent.calls import SseDecoder, classify, request_body
from docket.agent.config import config_from
from docket.cli import main as cli_main
from docket.errors import InputError

TOKEN = "run-token-0123"
RUN_TIMEOUT = 30  # seconds: every agent process the tests start is bounded by this


# ---------------------------------------------------------------- the double


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    sse: list[bytes] | None = None  # stream these chunks, then close the connection


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict
    arrived: float  # time.monotonic() when the request was read
    replied: float = 0.0  # when the answer began to be written: the agent cannot have it sooner
    status: int = 0


def openai_ok(n: int = 0) -> Reply:
    doc = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    return Reply(200, json.dumps(doc).encode(), {"content-type": "application/json"})


def refusal(status: int, kind: str, retry_after: str | None = None) -> Reply:
    headers = {"content-type": "application/json"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    body = json.dumps({"error": {"message": kind, "type": kind, "code": None}}).encode()
    return Reply(status, body, headers)


class Double:
    """Scripted model server; `respond(n, body)` answers the n-th model call (0-based)."""

    def __init__(self, respond: Callable[[int, dict], Reply], backoff_status: int = 204):
        self.respond = respond
        self.backoff_status = backoff_status
        self.model_calls: list[Received] = []
        self.backoff_posts: list[Received] = []
        self.gate = 0  # hold the first `gate` model calls until that many are in flight
        self.gate_timed_out = False
        self.inflight = 0
        self.max_inflight = 0
        self._cond = threading.Condition()
        self._gate_open = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for the loop to look up.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Double:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._gate_open = True  # release any held handler before shutting down
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _hold_at_gate(self) -> None:
        with self._cond:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            if self.inflight >= self.gate:
                self._gate_open = True
                self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._gate_open, timeout=5):
                self.gate_timed_out = True
                self._gate_open = True  # fail once, not once per held call

    def _leave(self) -> None:
        with self._cond:
            self.inflight -= 1

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
                return  # the double's record is the lists above, not stderr noise

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                got = Received(
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(raw) if raw else {},
                    arrived=time.monotonic(),
                )
                if self.path.endswith("/docket/agent/backoff"):
                    double.backoff_posts.append(got)
                    self._answer(got, Reply(double.backoff_status))
                    return
                with double._cond:
                    n = len(double.model_calls)
                    double.model_calls.append(got)
                double._hold_at_gate()
                try:
                    self._answer(got, double.respond(n, got.body))
                finally:
                    double._leave()

            def _answer(self, got: Received, reply: Reply) -> None:
                got.status = reply.status
                got.replied = time.monotonic()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.sse is None:
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                else:
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("connection", "close")
                    self.end_headers()
                    for chunk in reply.sse:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    self.close_connection = True
                self.wfile.flush()

        return Handler


# ---------------------------------------------------------------- running the agent


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict:
        lines = self.stdout.splitlines()
        assert len(lines) == 1, f"expected one summary line, got {self.stdout!r}"
        return json.loads(lines[0])


def agent(env: dict[str, str], *flags: str) -> Run:
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "docket", "agent", *flags],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def openai_env(double: Double, **settings: str) -> dict[str, str]:
    env = {
        "OPENAI_BASE_URL": f"{double.root}/openai/v1",
        "OPENAI_API_KEY": TOKEN,
        "DOCKET_BOUNDARY_URL": double.root,
        "DOCKET_AGENT_TIMEOUT": "10",
    }
    env.update({f"DOCKET_AGENT_{k.upper()}": v for k, v in settings.items()})
    return env


def assert_one_line_error(run: Run, *needles: str) -> None:
    assert run.stdout == "" or len(run.stdout.splitlines()) == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "Traceback" not in run.stderr
    for needle in needles:
        assert needle in lines[0]


# ---------------------------------------------------------------- once and stream


def test_once_sends_one_openai_call_with_the_run_token():
    with Double(lambda n, body: openai_ok(n)) as double:
        run = agent(openai_env(double, model="gpt-test", max_tokens="7"))
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 1
    call = double.model_calls[0]
    assert call.path == "/openai/v1/chat/completions"
    assert call.headers["authorization"] == f"Bearer {TOKEN}"
    assert call.body["model"] == "gpt-test"
    assert call.body["max_tokens"] == 7
    assert "stream" not in call.body
    s = run.summary
    assert (s["mode"], s["calls"], s["ok"], s["refused"], s["errors"]) == ("once", 1, 1, {}, {})


def test_once_speaks_anthropic_when_told():
    def respond(n, body):
        doc = {"type": "message", "content": [{"type": "text", "text": "hi"}]}
        return Reply(200, json.dumps(doc).encode(), {"content-type": "application/json"})

    with Double(respond) as double:
        env = {
            "ANTHROPIC_BASE_URL": f"{double.root}/anthropic",
            "ANTHROPIC_API_KEY": TOKEN,
            "DOCKET_AGENT_PROVIDER": "anthropic",
        }
        run = agent(env)
    assert run.code == 0, run.stderr
    (call,) = double.model_calls
    assert call.path == "/anthropic/v1/messages"
    assert call.headers["x-api-key"] == TOKEN
    assert call.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in call.headers
    assert run.summary["provider"] == "anthropic" and run.summary["ok"] == 1


def test_once_fails_in_one_line_when_its_call_is_refused():
    with Double(lambda n, body: refusal(500, "server_error")) as double:
        run = agent(openai_env(double))
    assert run.code == 1
    assert_one_line_error(run, "docket: agent: the call was refused: HTTP 500 (server_error)")
    assert run.summary["ok"] == 0 and run.summary["refused"] == {"500": 1}
    assert len(double.model_calls) == 1


@pytest.mark.parametrize(
    "provider, body",
    [
        ("openai", b"{not json"),
        ("openai", b'{"id": 1}'),
        ("openai", b"[]"),
        ("anthropic", b'{"type": "message"}'),
        ("anthropic", b"\xff\xfe"),
    ],
)
def test_a_2xx_without_the_providers_shape_is_an_error_not_a_success(provider, body):
    outcome = classify(provider, 200, body, None)
    assert (outcome.kind, outcome.reason) == ("error", "malformed_body")


def sse(*events: str) -> list[bytes]:
    return [f"data: {e}\n\n".encode() for e in events]


def test_stream_reads_to_done_and_times_the_first_byte():
    chunk = json.dumps({"choices": [{"delta": {"content": "hi"}}]})
    events = [chunk] * 5 + ["[DONE]"]
    with Double(lambda n, body: Reply(200, sse=sse(*events))) as double:
        run = agent(openai_env(double, mode="stream"))
    assert run.code == 0, run.stderr
    (call,) = double.model_calls
    assert call.body["stream"] is True
    s = run.summary
    assert s["ok"] == 1 and s["events"] == 6
    assert 0 < s["ttfb_s"] <= s["total_s"]


def test_a_stream_cut_before_done_is_a_failure():
    chunk = json.dumps({"choices": [{"delta": {"content": "hi"}}]})
    with Double(lambda n, body: Reply(200, sse=sse(chunk, chunk))) as double:
        run = agent(openai_env(double, mode="stream"))
    assert run.code == 1
    assert_one_line_error(run, "truncated_stream")
    assert run.summary["errors"] == {"truncated_stream": 1}


# ---------------------------------------------------------------- loop and hammer


def test_loop_stops_at_a_policy_denial():
    def respond(n, body):
        return openai_ok(n) if n < 3 else refusal(403, "docket_policy_denied")

    with Double(respond) as double:
        run = agent(openai_env(double, mode="loop", calls="50"))
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 4  # three answered, the denial, nothing after
    prompts = [c.body["messages"][0]["content"] for c in double.model_calls]
    assert len(set(prompts)) == 4  # each call of the loop is a new call, not a resend
    s = run.summary
    assert s["calls"] == 4 and s["ok"] == 3
    assert s["refused"] == {"403": 1} and s["refused_types"] == {"docket_policy_denied": 1}
    assert s["stopped"] == "docket_policy_denied"


def test_loop_goes_through_other_refusals_to_its_call_count():
    def respond(n, body):
        return refusal(429, "docket_rate_limited", "0") if n % 2 else openai_ok(n)

    with Double(respond) as double:
        run = agent(openai_env(double, mode="loop"), "--calls", "6")
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 6
    assert run.summary["refused"] == {"429": 3} and run.summary["stopped"] == "done"


def test_repeat_sends_one_body_byte_for_byte_with_the_temperature_given():
    def respond(n, body):
        return openai_ok(n) if n < 4 else refusal(403, "docket_policy_denied")

    with Double(respond) as double:
        run = agent(openai_env(double, mode="repeat", calls="9"), "--temperature", "0")
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 5  # four answered, the denial, nothing after
    bodies = [c.body for c in double.model_calls]
    assert all(b == bodies[0] for b in bodies)  # the same question every time
    assert bodies[0]["temperature"] == 0 and type(bodies[0]["temperature"]) is int
    s = run.summary
    assert (s["mode"], s["calls"], s["ok"], s["stopped"]) == (
        "repeat",
        5,
        4,
        "docket_policy_denied",
    )


def test_hammer_keeps_its_workers_in_flight_and_counts_refusals():
    with Double(
        lambda n, body: refusal(429, "rate_limit_exceeded") if n % 3 == 0 else openai_ok(n)
    ) as double:
        double.gate = 4  # the first four calls are held until all four are in flight
        run = agent(openai_env(double, mode="hammer", calls="12", concurrency="4"))
    assert run.code == 0, run.stderr
    assert not double.gate_timed_out, "the agent never had four calls in flight"
    assert double.max_inflight == 4
    assert len(double.model_calls) == 12
    s = run.summary
    assert s["calls"] == 12 and s["ok"] == 8 and s["refused"] == {"429": 4}
    assert s["concurrency"] == 4


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGTERM, "sigterm"), (signal.SIGINT, "sigint")])
def test_a_stop_signal_ends_the_calls_and_the_agent_still_reports(sig, name):
    held = threading.Event()  # calls from the third on are held until the test lets go

    def respond(n, body):
        if n >= 2:
            held.wait(RUN_TIMEOUT)
        return openai_ok(n)

    double = Double(respond)
    # The held calls are answered after the agent has gone: their writes fail. Kept
    # here (and checked below) rather than printed by socketserver.
    handler_errors: list[BaseException | None] = []
    double._server.handle_error = lambda request, address: handler_errors.append(sys.exc_info()[1])
    env = openai_env(double, mode="hammer", calls="50", concurrency="2")
    env |= {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    with double:
        proc = subprocess.Popen(
            [sys.executable, "-m", "docket", "agent"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # two answered, two held in flight: the agent is mid-run
            wait_until(lambda: len(double.model_calls) == 4, RUN_TIMEOUT, "two calls in flight")
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            held.set()
        calls_seen = len(double.model_calls)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    s = Run(proc.returncode, out, err).summary
    assert s["stopped"] == name
    assert (s["calls"], s["ok"], s["interrupted"]) == (2, 2, 2)
    assert calls_seen == 4  # no call after the signal
    assert all(isinstance(e, ConnectionError) for e in handler_errors), handler_errors


def test_a_signal_while_the_agent_starts_still_gets_a_report(monkeypatch, capsys):
    # agent_command catches the stop signals before it reads its settings or starts
    # trio; one that arrives then stops the run before its first call.
    import docket.agent.command as agent_module

    real_config_from = agent_module.config_from

    def config_then_signal(env, overrides):
        config = real_config_from(env, overrides)
        signal.raise_signal(signal.SIGTERM)  # handled: the test process goes on
        return config

    monkeypatch.setattr(agent_module, "config_from", config_then_signal)
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": TOKEN}
    before = signal.getsignal(signal.SIGTERM)
    status = agent_module.agent_command({}, env=env)
    s = json.loads(capsys.readouterr().out)
    assert status == 143
    assert (s["stopped"], s["calls"], s["interrupted"]) == ("sigterm", 0, 0)
    assert signal.getsignal(signal.SIGTERM) == before  # put back as it was


def test_an_unreachable_server_is_a_one_line_failure():
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/openai/v1",
        "OPENAI_API_KEY": TOKEN,
        "DOCKET_AGENT_MODE": "loop",
        "DOCKET_AGENT_CALLS": "3",
    }
    run = agent(env)
    assert run.code == 1
    assert_one_line_error(run, "no call got an HTTP answer", "ConnectError")
    assert run.summary["errors"] == {"ConnectError": 3} and run.summary["answered"] == 0


# ---------------------------------------------------------------- backoff


def test_backoff_honours_retry_after_and_reports_each_wait_first():
    def respond(n, body):
        if n in (0, 1):
            return refusal(429, "docket_rate_limited", retry_after="0.3")
        return openai_ok(n)

    with Double(respond) as double:
        env = openai_env(double, mode="backoff", calls="2", seed="3")
        run = agent(env, "--backoff-base", "0.05", "--backoff-cap", "0.2")
    assert run.code == 0, run.stderr
    calls = double.model_calls
    assert [c.status for c in calls] == [429, 429, 200, 200]
    # The first call is retried with the same bytes; the second call is a new call.
    assert calls[0].body == calls[1].body == calls[2].body != calls[3].body
    for refused, retry in [(calls[0], calls[1]), (calls[1], calls[2])]:
        assert retry.arrived - refused.replied >= 0.3
    posts = [p.body for p in double.backoff_posts]
    # The hint outlasts the jitter envelope (0.05 then 0.1), so the wait is the hint.
    assert posts == [
        {"attempt": 1, "wait_s": 0.3, "retry_after": 0.3, "status": 429},
        {"attempt": 2, "wait_s": 0.3, "retry_after": 0.3, "status": 429},
    ]
    for post, (refused, retry) in zip(
        double.backoff_posts, [(calls[0], calls[1]), (calls[1], calls[2])], strict=True
    ):
        assert refused.replied <= post.arrived <= retry.arrived
        assert post.headers["authorization"] == f"Bearer {TOKEN}"
    s = run.summary
    assert s["retries"] == 2 and s["waited_s"] == pytest.approx(0.6)
    assert s["calls"] == 4 and s["ok"] == 2 and s["refused"] == {"429": 2}
    assert s["reports"] == {"sent": 2}


def test_backoff_jitter_is_the_seeded_policy_and_ignores_http_dates():
    statuses = [503, 529, 429]
    date = "Wed, 21 Oct 2037 07:28:00 GMT"  # far in the future: honoured, it would hang

    def respond(n, body):
        return refusal(statuses[n], "overloaded", retry_after=date) if n < 3 else openai_ok(n)

    with Double(respond) as double:
        env = openai_env(double, mode="backoff", calls="1", seed="1234")
        run = agent(env, "--backoff-base", "0.02", "--backoff-cap", "0.5")
    assert run.code == 0, run.stderr
    policy, rng = BackoffPolicy(base=0.02, cap=0.5), Random(1234)
    expected = [policy.delay(a, None, rng) for a in range(3)]
    posts = [p.body for p in double.backoff_posts]
    assert [p["wait_s"] for p in posts] == expected
    assert [p["retry_after"] for p in posts] == [None, None, None]
    assert [p["status"] for p in posts] == statuses
    calls = double.model_calls
    for wait, refused, retry in zip(expected, calls, calls[1:], strict=False):
        assert retry.arrived - refused.replied >= wait
    assert run.summary["seed"] == 1234


def test_backoff_gives_up_after_max_attempts_and_moves_on():
    with Double(lambda n, body: refusal(503, "overloaded", retry_after="0")) as double:
        env = openai_env(double, mode="backoff", calls="2", max_attempts="3", retry_floor="4")
        run = agent(env, "--backoff-base", "0.01", "--backoff-cap", "0.02")
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 6  # three attempts of each of two calls
    bodies = [c.body["messages"][0]["content"] for c in double.model_calls]
    assert len(set(bodies[:3])) == 1 and len(set(bodies[3:])) == 1 and bodies[0] != bodies[3]
    assert [p.body["attempt"] for p in double.backoff_posts] == [1, 2, 1, 2]
    s = run.summary
    assert s["gave_up"] == {"max_attempts": 2} and s["retries"] == 4 and s["ok"] == 0


def test_backoff_gives_up_on_a_hint_longer_than_it_will_wait():
    with Double(lambda n, body: refusal(429, "rate_limited", retry_after="3600")) as double:
        run = agent(openai_env(double, mode="backoff", calls="1"))
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 1 and double.backoff_posts == []
    assert run.summary["gave_up"] == {"retry_after_too_long": 1}


def test_backoff_without_the_boundary_route_says_so_once_and_carries_on():
    def respond(n, body):
        return refusal(429, "rate_limited", retry_after="0") if n < 3 else openai_ok(n)

    with Double(respond, backoff_status=404) as double:
        env = openai_env(double, mode="backoff", calls="1")
        run = agent(env, "--backoff-base", "0.01", "--backoff-cap", "0.02")
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 4 and run.summary["ok"] == 1
    assert len(double.backoff_posts) == 1  # asked once, then not again
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "404" in lines[0] and "/docket/agent/backoff" in lines[0]
    assert run.summary["reports"] == {"failed": 1, "unreported": 2}


def test_backoff_stops_at_a_policy_denial():
    def respond(n, body):
        return refusal(429, "rate_limited", "0") if n == 0 else refusal(403, "docket_policy_denied")

    with Double(respond) as double:
        env = openai_env(double, mode="backoff", calls="5")
        run = agent(env, "--backoff-base", "0.01")
    assert run.code == 0, run.stderr
    assert len(double.model_calls) == 2
    assert run.summary["stopped"] == "docket_policy_denied"


def test_backoff_retries_gateway_failures_and_never_another_4xx():
    replies = [refusal(502, "bad_gateway"), refusal(504, "gateway_timeout"), openai_ok(2)]
    replies += [refusal(400, "invalid_request_error"), refusal(404, "not_found_error")]

    with Double(lambda n, body: replies[n]) as double:
        env = openai_env(double, mode="backoff", calls="3", retry_floor="10")
        run = agent(env, "--backoff-base", "0.01", "--backoff-cap", "0.02")
    assert run.code == 0, run.stderr
    # 502 and 504 retried; 400 and 404 are each their call's last attempt
    assert [c.status for c in double.model_calls] == [502, 504, 200, 400, 404]
    contents = [c.body["messages"][0]["content"] for c in double.model_calls]
    assert len(set(contents[:3])) == 1 and len(set(contents)) == 3
    assert [c.headers["x-stainless-retry-count"] for c in double.model_calls] == list("01200")
    assert [p.body["status"] for p in double.backoff_posts] == [502, 504]
    assert run.summary["retries"] == 2 and run.summary["gave_up"] == {}


def test_backoff_retries_a_connection_that_was_never_made():
    with socket.socket() as bound:  # bound, never listening: every connect is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        env = {
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/openai/v1",
            "OPENAI_API_KEY": TOKEN,
            "DOCKET_AGENT_MODE": "backoff",
            "DOCKET_AGENT_CALLS": "1",
            "DOCKET_AGENT_MAX_ATTEMPTS": "3",
        }
        run = agent(env, "--backoff-base", "0.01", "--backoff-cap", "0.02")
    assert run.code == 1  # no call got an HTTP answer: the verdict says so
    assert "no call got an HTTP answer" in run.stderr
    s = run.summary
    assert s["errors"] == {"ConnectError": 3} and s["retries"] == 2
    assert s["gave_up"] == {"max_attempts": 1}


def test_backoff_keeps_one_deadline_per_call_and_sends_what_is_left():
    # Every attempt refused with Retry-After 0.3 s; the call has 1 s: attempts at about
    # 0, 0.3, 0.6 and 0.9 s, then the hint outlasts what is left and the call is given up.
    with Double(lambda n, body: refusal(503, "overloaded", retry_after="0.3")) as double:
        env = openai_env(double, mode="backoff", calls="1", max_attempts="50", retry_floor="50")
        run = agent(env, "--deadline", "1", "--backoff-base", "0.01", "--backoff-cap", "0.02")
    assert run.code == 0, run.stderr
    calls = double.model_calls
    assert 2 <= len(calls) <= 4, [c.arrived - calls[0].arrived for c in calls]
    lefts = [int(c.headers["x-docket-deadline-ms"]) for c in calls]
    assert lefts[0] <= 1000 and lefts == sorted(lefts, reverse=True)
    for c in calls:
        assert c.arrived - calls[0].arrived < 1.0  # no attempt after the deadline
    for before, after, left_before, left_after in zip(
        calls, calls[1:], lefts, lefts[1:], strict=False
    ):
        # The header shrinks by the time that passed: the agent's drop between two
        # attempts and the gap the server saw measure the same interval, from the two
        # ends of a socket, differing only by the two deliveries' delays (which beside
        # two CPU hogs differed by 9.6 ms once), and it waited out the 300 ms hint.
        drop, gap = left_before - left_after, (after.arrived - before.arrived) * 1000
        assert abs(drop - gap) <= 50, (drop, gap)
        assert drop >= 299, (drop, gap)
    assert lefts[-1] <= 1000 - 300 * (len(calls) - 1) + 5
    assert run.summary["gave_up"] == {"deadline": 1}
    assert run.summary["elapsed_s"] < 1.5


def test_backoff_keeps_its_retries_within_the_budget():
    # Every attempt refused at once: the budget alone bounds the retries, 3 + 0.1 per call.
    with Double(lambda n, body: refusal(503, "overloaded", retry_after="0")) as double:
        env = openai_env(double, mode="backoff", calls="20", max_attempts="8")
        run = agent(env, "--backoff-base", "0.001", "--backoff-cap", "0.002")
    assert run.code == 0, run.stderr
    retries = sum(1 for c in double.model_calls if c.headers["x-stainless-retry-count"] != "0")
    assert len(double.model_calls) == 20 + 5 and retries == 5  # 3 + 0.1 * 20
    budget = run.summary["retry_budget"]
    assert budget["first_attempts"] == 20 and budget["retries"] == 5
    assert budget["ratio"] == 0.1 and budget["floor"] == 3
    # every call that could not retry said so: 20 calls, each given up once
    assert run.summary["gave_up"]["retry_budget"] == budget["refused"]
    assert sum(run.summary["gave_up"].values()) == 20


# ---------------------------------------------------------------- misconfiguration


def settings_env(**changes: str | None) -> dict[str, str]:
    """A working environment with some keys changed (None removes one)."""
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/openai/v1", "OPENAI_API_KEY": TOKEN}
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize(
    "env, flags, needles",
    [
        (settings_env(OPENAI_BASE_URL=None), [], ["OPENAI_BASE_URL is not set"]),
        (settings_env(OPENAI_API_KEY=None), [], ["OPENAI_API_KEY is not set"]),
        (settings_env(DOCKET_AGENT_PROVIDER="anthropic"), [], ["ANTHROPIC_BASE_URL is not set"]),
        (settings_env(DOCKET_AGENT_MODE="spin"), [], ["DOCKET_AGENT_MODE='spin'", "not one of"]),
        (settings_env(), ["--calls", "many"], ["--calls='many'", "must be a whole number"]),
        (settings_env(DOCKET_AGENT_CONCURRENCY="0"), [], ["DOCKET_AGENT_CONCURRENCY='0'"]),
        (settings_env(), ["--timeout", "-1"], ["--timeout='-1'", "positive"]),
        (settings_env(), ["--backoff-cap", "nan"], ["--backoff-cap='nan'"]),
        (settings_env(OPENAI_BASE_URL="ftp://127.0.0.1/v1"), [], ["OPENAI_BASE_URL=", "http(s)"]),
        (settings_env(DOCKET_BOUNDARY_URL="127.0.0.1:9"), [], ["DOCKET_BOUNDARY_URL="]),
        (settings_env(), ["--provider", "gemini"], ["--provider='gemini'"]),
        (settings_env(), ["--temperature", "2.5"], ["--temperature='2.5'", "from 0 to 2"]),
        (settings_env(DOCKET_AGENT_TEMPERATURE="-0"), [], ["DOCKET_AGENT_TEMPERATURE='-0'"]),
        (settings_env(DOCKET_AGENT_TEMPERATURE="nan"), [], ["DOCKET_AGENT_TEMPERATURE='nan'"]),
        (settings_env(), ["--temperature", "\u0661"], ["--temperature=", "from 0 to 2"]),
        (settings_env(), ["--bogus"], ["unrecognized arguments: --bogus"]),
        (settings_env(), ["--retry-ratio", "1.5"], ["--retry-ratio='1.5'", "from 0 to 1"]),
        (settings_env(DOCKET_AGENT_RETRY_RATIO="0.1234"), [], ["DOCKET_AGENT_RETRY_RATIO="]),
        (settings_env(), ["--retry-floor", "-1"], ["--retry-floor='-1'"]),
        (settings_env(DOCKET_AGENT_DEADLINE="0"), [], ["DOCKET_AGENT_DEADLINE='0'", "positive"]),
    ],
)
def test_misconfiguration_is_one_line_and_exit_2(env, flags, needles, monkeypatch, capsys):
    # In-process through the real CLI entry point (a process per case costs a
    # third of a second each); the two cases below run it as a real process.
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "ANTHROPIC_", "DOCKET_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = cli_main(["agent", *flags])
    out, err = capsys.readouterr()
    assert code == 2
    assert_one_line_error(Run(code, out, err), "docket: ", *needles)
    assert out == ""


@pytest.mark.parametrize(
    "env, flags, needle",
    [
        (settings_env(OPENAI_BASE_URL=None), [], "OPENAI_BASE_URL is not set"),
        (settings_env(), ["--max-attempts", "0"], "--max-attempts='0': must be at least 1"),
    ],
)
def test_misconfiguration_exits_2_from_a_real_process(env, flags, needle):
    run = agent(env, *flags)
    assert run.code == 2
    assert run.stdout == ""
    assert_one_line_error(run, "docket: agent: ", needle)


# ---------------------------------------------------------------- pure pieces


def test_config_flags_override_the_environment():
    env = {
        "OPENAI_BASE_URL": "http://127.0.0.1:9/openai/v1",
        "OPENAI_API_KEY": TOKEN,
        "DOCKET_AGENT_MODE": "loop",
        "DOCKET_AGENT_CALLS": "5",
    }
    config = config_from(env, {"DOCKET_AGENT_CALLS": "9", "DOCKET_AGENT_MODE": None})
    assert (config.mode, config.calls) == ("loop", 9)
    assert config.endpoint == "http://127.0.0.1:9/openai/v1/chat/completions"
    with pytest.raises(InputError, match="--calls='0'"):
        config_from(env, {"DOCKET_AGENT_CALLS": "0"})


def test_without_a_temperature_the_body_is_what_it_always_was():
    # The modes that existed before --temperature send the same bytes as before it.
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/openai/v1", "OPENAI_API_KEY": TOKEN}
    body = request_body(config_from(env), 3, stream=True)
    assert json.dumps(body) == (
        '{"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content":'
        ' "Say hello. This is call 3."}], "stream": true, "stream_options":'
        ' {"include_usage": true}}'
    )
    warm = request_body(config_from(env, {"DOCKET_AGENT_TEMPERATURE": "0.7"}), 3, stream=False)
    assert warm["temperature"] == 0.7
    assert config_from(env, {"DOCKET_AGENT_TEMPERATURE": "2"}).temperature == 2


@pytest.mark.parametrize(
    "provider, body",
    [
        ("openai", b'{"error": {"type": "docket_policy_denied", "message": "cap"}}'),
        ("anthropic", b'{"type": "error", "error": {"type": "docket_policy_denied"}}'),
    ],
)
def test_a_policy_denial_is_read_from_either_providers_error_shape(provider, body):
    outcome = classify(provider, 403, body, None)
    assert outcome.kind == "refused" and outcome.policy_denied


def test_a_refusal_without_a_json_body_is_still_a_refusal():
    outcome = classify("openai", 502, b"<html>bad gateway</html>", "5")
    assert (outcome.kind, outcome.status, outcome.error_type, outcome.retry_after) == (
        "refused",
        502,
        None,
        "5",
    )
    assert not outcome.policy_denied


ANTHROPIC_STREAM = (
    b'event: message_start\r\ndata: {"type": "message_start"}\r\n\r\n'
    b": keep-alive\n\n"
    b'event: content_block_delta\ndata: {"type": "content_block_delta"}\n\n'
    b'event: message_delta\ndata: {"type": "message_delta"}\n\n'
    b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
)


@settings()
@given(st.lists(st.integers(min_value=0, max_value=len(ANTHROPIC_STREAM)), max_size=12))
def test_sse_decoding_does_not_depend_on_where_the_bytes_split(cuts):
    bounds = [0, *sorted(cuts), len(ANTHROPIC_STREAM)]
    decoder = SseDecoder("anthropic")
    for start, end in zip(bounds, bounds[1:], strict=False):
        decoder.feed(ANTHROPIC_STREAM[start:end])
    assert decoder.events == 4
    assert decoder.outcome(200).kind == "ok"


def test_a_stream_without_its_last_event_is_truncated():
    decoder = SseDecoder("anthropic")
    decoder.feed(ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"event: message_stop")])
    outcome = decoder.outcome(200)
    assert (outcome.kind, outcome.reason) == ("error", "truncated_stream")
    assert decoder.events == 3


def test_an_error_event_mid_stream_is_a_failure():
    decoder = SseDecoder("anthropic")
    decoder.feed(
        b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n'
    )
    outcome = decoder.outcome(200)
    assert (outcome.kind, outcome.reason, outcome.detail) == (
        "error",
        "stream_error",
        "overloaded_error",
    )


# ---------------------------------------------------------------- against the stub providers


@pytest.mark.parametrize(
    "kind, mode",
    [("openai", "once"), ("openai", "stream"), ("anthropic", "once"), ("anthropic", "stream")],
)
async def test_the_agent_speaks_each_stub_providers_shapes(kind, mode):
    import trio

    stub_server = pytest.importorskip("chaos.stub.server")
    stub = stub_server.Stub(stub_server.StubConfig(kind=kind, token_delay=0.01))
    prefix = kind.upper()
    with trio.fail_after(RUN_TIMEOUT):
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(stub.serve)
            env = {
                "PATH": os.environ.get("PATH", ""),
                f"{prefix}_BASE_URL": listening.url + ("/v1" if kind == "openai" else ""),
                f"{prefix}_API_KEY": TOKEN,
                "DOCKET_AGENT_PROVIDER": kind,
                "DOCKET_AGENT_MODE": mode,
                "DOCKET_AGENT_MAX_TOKENS": "8",
            }
            proc = await trio.run_process(
                [sys.executable, "-m", "docket", "agent"],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            nursery.cancel_scope.cancel()
    run = Run(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert run.code == 0, run.stderr
    (entry,) = stub.log.entries()
    assert entry["path"] == ("/v1/chat/completions" if kind == "openai" else "/v1/messages")
    assert entry["key"] == stub_server.fingerprint(TOKEN)
    s = run.summary
    assert (s["provider"], s["calls"], s["ok"], s["errors"]) == (kind, 1, 1, {})
    if mode == "stream":
        assert s["events"] > 8  # the stub streams one event per token, and more around them
        assert 0 < s["ttfb_s"] < s["total_s"]  # eight tokens 10 ms apart come after the first byte
