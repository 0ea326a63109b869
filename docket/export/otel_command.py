"""`docket export otel RUN`, and the export a run makes when it ends ([export] in the policy).

The ledger is verified whole first (the chain and the tally's event checks, as
`docket show` reads it): a broken one is refused, one line, exit 2, and nothing is
sent. Then it is read again and sent as it is folded, up to the line count and head
the first pass saw, so memory stays bounded by the calls in flight, never the run's
length, and a ledger changed between the two passes is refused rather than half
trusted. Exit codes: 0 sent, 1 the endpoint did not take it (unreachable, refused,
timed out), 2 the ledger or an argument is bad.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from docket.errors import EXIT_OK, CheckFailed, DocketError, InputError, one_line
from docket.export.otel_fold import RunFold, Upstream
from docket.reading.source import ledger_path, read_lines

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Exported:
    run_id: str
    trace_id: int
    spans: int
    calls: int
    span_events: int

    def line(self, endpoint: str) -> str:
        return (
            f"exported run {self.run_id} to {endpoint}: trace {self.trace_id:032x}, "
            f"{self.spans} spans ({self.calls} model calls), {self.span_events} span events"
        )


def parse_headers(pairs: list[str], where: str) -> dict[str, str]:
    """K=V pairs (a flag's, or an OTLP headers variable's split on commas), values
    percent-decoded as OTEL_EXPORTER_OTLP_HEADERS has them; anything else one line."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key or any(c in key for c in " \t\r\n:"):
            raise InputError(f"{where}: want KEY=VALUE, got {one_line(pair[:60])!r}")
        decoded = unquote(value.strip())
        if "\r" in decoded or "\n" in decoded:
            raise InputError(f"{where}: the value of {key!r} holds a line break")
        out[key] = decoded
    return out


def headers_from_env(name: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The headers the variable `name` holds (k=v,k2=v2), or none when unset."""
    if not name or not environ.get(name):
        return {}
    return parse_headers(environ[name].split(","), f"[export] otlp_headers_env {name}")


def upstreams_from_policy(policy) -> dict[str, Upstream]:
    """Each provider's API kind, host and port (the ledger keeps only the URL's path)."""
    out = {}
    for name, p in policy.providers.items():
        parts = urlsplit(p.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out[name] = Upstream(p.kind, parts.hostname or "", port)
    return out


def _verified_extent(path: Path) -> tuple[int, str]:
    """Read the whole ledger through the verifier: its line count and head."""
    live: list[int] = []
    count, head = 0, ""
    for line, _ in read_lines(path, live):
        count += 1
        head = hashlib.sha256(line).hexdigest()
    if live:
        raise InputError(
            f"ledger {path}: still being written (pid {live[0]}); export it when the run ends"
        )
    if count == 0:
        raise InputError(f"ledger {path}: holds no events")
    return count, head


def export_ledger(
    path: Path,
    endpoint: str,
    headers: Mapping[str, str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    upstreams: Mapping[str, Upstream] | None = None,
    metrics: bool = True,
) -> Exported:
    """Verify, fold and send one run's ledger. InputError for a bad ledger (nothing
    sent), otel_send.ExportFailed when the endpoint does not take it."""
    count, head = _verified_extent(path)
    from docket.export.otel_send import OtlpSender  # the optional extra: only when sending

    fold = RunFold(upstreams)
    lines = read_lines(path)  # its file closes when the generator goes, at return
    try:
        first, first_event = next(lines)
    except StopIteration:
        raise InputError(f"ledger {path}: changed while it was being exported") from None
    first_hash = hashlib.sha256(first).hexdigest()
    fold.add(first_event, first_hash)
    seen, last_hash = 1, first_hash
    with OtlpSender(endpoint, headers, timeout, fold.run_id, fold.trace_id) as sender:
        for line, event in lines:
            if seen == count:  # what the first pass verified; anything after is not ours
                break
            seen, last_hash = seen + 1, hashlib.sha256(line).hexdigest()
            closed, measured = fold.add(event, last_hash)
            for span in closed:
                sender.span(span)
            sender.measure(measured)
        if (seen, last_hash) != (count, head):
            raise InputError(f"ledger {path}: changed while it was being exported")
        root, unclosed = fold.finish()
        for span in (*unclosed, root):
            sender.span(span)
        sender.flush()
        if metrics:  # a backend that takes traces only (Langfuse) answers metrics with an error
            sender.send_metrics()
        return Exported(fold.run_id, fold.trace_id, sender.sent, fold.calls, len(root.events))


def export_otel_command(
    run: str,
    endpoint: str | None,
    header_pairs: list[str],
    timeout: float | None,
    policy_path: str | None,
    metrics: bool = True,
) -> int:
    from docket.policy import load_policy, url_problem  # per verb

    target = endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT
    problem = url_problem(target)
    if problem:
        raise InputError(f"export otel: the endpoint {problem}, got {one_line(target)!r}")
    headers = parse_headers(header_pairs, "--header")
    upstreams = upstreams_from_policy(load_policy(policy_path)) if policy_path else None
    path = ledger_path(run)
    from docket.export.otel_send import ExportFailed  # the optional extra

    try:
        done = export_ledger(
            path,
            target,
            headers,
            timeout=timeout or DEFAULT_TIMEOUT_S,
            upstreams=upstreams,
            metrics=metrics,
        )
    except ExportFailed as exc:
        raise CheckFailed(f"export otel: {target} did not take the run: {exc}") from None
    print(done.line(target))
    return EXIT_OK


def export_at_run_end(ledger: Path, endpoint: str, headers: Mapping[str, str], policy) -> None:
    """The policy's export when a run has ended: after its receipt, off the request path.
    A failure is said on one line on stderr and changes no exit code. It is not
    recorded in the ledger: the export reads the finished ledger, and nothing may
    follow its session.end (spec/docket-receipt-1.md section 5)."""
    timeout = policy.export.otlp_timeout
    try:
        done = export_ledger(
            ledger,
            endpoint,
            headers,
            timeout=timeout,
            upstreams=upstreams_from_policy(policy),
            metrics=policy.export.otlp_metrics,
        )
    except DocketError as exc:
        print(
            f"docket: warning: export to {endpoint} failed: {one_line(str(exc))}", file=sys.stderr
        )
        return
    except Exception as exc:  # noqa: BLE001 - an export never changes how a run ended
        from docket.export.otel_send import ExportFailed

        what = str(exc) if isinstance(exc, ExportFailed) else f"{type(exc).__name__}: {exc}"
        print(f"docket: warning: export to {endpoint} failed: {one_line(what)}", file=sys.stderr)
        return
    print(f"docket: {done.line(endpoint)}", file=sys.stderr)
