"""One door out: every outbound connection docket/ makes is opened in
docket.http.client.open_upstream_stream, where the egress rule can stand in
front of it. This walks the syntax tree of every module in docket/ and fails on
any reference to something that opens a connection, anywhere else.

References are resolved through the module's imports (`import socket as s`,
`from trio import socket`, imports inside functions), and `getattr(module,
"name")` with a literal name is resolved too. What a static walk cannot see
(importlib, exec, a name built at run time) is out of its reach; review is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "docket"

# Fully qualified names that open (or create something that opens) an outbound connection.
OPENERS = frozenset(
    {
        "trio.open_tcp_stream",
        "trio.open_ssl_over_tcp_stream",
        "trio.open_unix_socket",
        "trio.socket.socket",
        "trio.socket.fromfd",
        "trio.socket.from_stdlib_socket",
        "socket.socket",
        "socket.create_connection",
        "socket.fromfd",
        "asyncio.open_connection",
        "asyncio.open_unix_connection",
        "ssl.SSLSocket",
        "http.client.HTTPConnection",
        "http.client.HTTPSConnection",
        "urllib.request.urlopen",
        "urllib.request.urlretrieve",
        "urllib.request.build_opener",
        "urllib.request.OpenerDirector",
        "ftplib.FTP",
        "ftplib.FTP_TLS",
        "smtplib.SMTP",
        "smtplib.SMTP_SSL",
        "xmlrpc.client.ServerProxy",
        *(
            f"httpx.{name}"
            for name in (
                "Client",
                "AsyncClient",
                "HTTPTransport",
                "AsyncHTTPTransport",
                "request",
                "stream",
                "get",
                "post",
                "put",
                "patch",
                "delete",
                "head",
                "options",
            )
        ),
        "openai.OpenAI",
        "openai.AsyncOpenAI",
        "anthropic.Anthropic",
        "anthropic.AsyncAnthropic",
    }
)
# Modules that exist to make outbound connections: any use at all is an opener.
OPENER_MODULES = ("requests", "aiohttp", "httpcore", "urllib3", "websockets", "pycurl", "h2")
# Methods that connect whatever object they are called on (an event loop, a socket).
CONNECTING_METHODS = frozenset({"create_connection", "sock_connect", "connect_ex"})

# (module path, function) -> the openers it may use, and why.
ALLOWED = {
    ("docket/http/client.py", "open_upstream_stream"): (
        {"trio.open_tcp_stream"},
        "the one door: every pool, the provider routes and the forward proxy reach it",
    ),
    ("docket/agent/command.py", "run_agent"): (
        {"httpx.AsyncClient"},
        "the reference agent is not the recorder: it is the process being recorded, run "
        "as `docket agent` (the child of `docket run`), and its client only talks to the "
        "boundary's base URL; its traffic is what the door and the egress rule watch",
    ),
    # docket selftest plays the agent against a boundary of its own on 127.0.0.1: its
    # clients are the recorded side, like the reference agent's.
    ("docket/selftest/rig.py", "boundary_rig"): (
        {"httpx.AsyncClient"},
        "selftest's agent: one client to the in-process boundary it is testing",
    ),
    ("docket/selftest/rig.py", "<module>"): (
        {"httpx.AsyncClient"},
        "the Rig dataclass's annotation of that client (a type, no connection)",
    ),
    # docket export otel sends a finished run's record to the collector the user named,
    # after the run (never on a model call's path, never from the boundary); its exporter
    # (opentelemetry's HTTP session) connects inside a library this walk cannot see into.
    ("docket/export/otel_send.py", "_reach_problem"): (
        {"socket.create_connection", "<object>.create_connection"},
        "export's diagnosis of an unreachable collector: one plain connect, to name why",
    ),
    ("docket/selftest/checks_calls.py", "egress"): (
        {"httpx.AsyncClient"},
        "selftest's egress check: an agent asking the boundary's forward proxy for a "
        "host the policy does not allow, which the boundary must refuse (403)",
    ),
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    where: str  # the enclosing function's qualified name, or "<module>"
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.where}: {self.name}"


class _Walker(ast.NodeVisitor):
    def __init__(self, path: str, aliases: dict[str, str]) -> None:
        self.path = path
        self.aliases = aliases
        self.scope: list[str] = []
        self.functions: list[str] = []
        self.findings: list[Finding] = []

    def _flag(self, node: ast.AST, name: str) -> None:
        where = ".".join(self.functions) if self.functions else "<module>"
        self.findings.append(Finding(self.path, node.lineno, where, name))

    def _enter(self, node, is_function: bool) -> None:
        self.scope.append(node.name)
        if is_function:
            self.functions.append(node.name)
        self.generic_visit(node)
        self.scope.pop()
        if is_function:
            self.functions.pop()

    def visit_FunctionDef(self, node):
        self._enter(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self._enter(node, False)

    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _check(self, node: ast.AST, name: str | None) -> bool:
        if name is None:
            return False
        if name in OPENERS or name.split(".")[0] in OPENER_MODULES:
            self._flag(node, name)
            return True
        return False

    def visit_Attribute(self, node: ast.Attribute):
        if not self._check(node, self.resolve(node)):
            self.generic_visit(node)  # the outermost name that opens is reported, once

    def visit_Name(self, node: ast.Name):
        self._check(node, self.resolve(node))

    def visit_Call(self, node: ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in CONNECTING_METHODS:
            self._flag(node, f"<object>.{func.attr}")
        if (
            isinstance(func, ast.Name)
            and func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = self.resolve(node.args[0])
            if base:
                self._check(node, f"{base}.{node.args[1].value}")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self._check(node, alias.name)  # `import requests`; `import socket` is not a finding

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.module and node.level == 0:
            for alias in node.names:
                self._check(node, f"{node.module}.{alias.name}")


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> fully qualified name, from every import in the module (those
    inside functions included: lazy imports are the rule in docket/)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    out[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def openers_in(source: str, path: str) -> list[Finding]:
    """Every reference to an outbound-connection opener in one module's source."""
    tree = ast.parse(source, filename=path)
    walker = _Walker(path, _aliases(tree))
    walker.visit(tree)
    return walker.findings


def violations(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.name not in ALLOWED.get((f.path, f.where), (set(), ""))[0]]


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


# ---------------------------------------------------------------- the check


def test_every_outbound_connection_goes_through_the_one_door():
    findings = []
    for module in package_modules():
        path = module.relative_to(ROOT).as_posix()
        findings += openers_in(module.read_text(encoding="utf-8"), path)
    bad = violations(findings)
    assert not bad, "outbound connections opened outside open_upstream_stream:\n" + "\n".join(
        map(str, bad)
    )
    # The exemptions are live: each is used, and the walker sees the door itself.
    used = {(f.path, f.where) for f in findings}
    assert used == set(ALLOWED), f"stale exemption(s): {set(ALLOWED) - used}"


def test_the_walk_covers_the_whole_package():
    modules = package_modules()
    paths = {m.relative_to(ROOT).as_posix() for m in modules}
    assert {"docket/http/client.py", "docket/boundary/proxy.py", "docket/agent/command.py"} <= paths
    assert len(modules) > 20


# ---------------------------------------------------------------- the walker can fail


@pytest.mark.parametrize(
    "source, name",
    [
        ("import trio\nasync def f():\n    await trio.open_tcp_stream('h', 1)\n", "trio.open_tcp_stream"),
        ("import trio as t\nasync def f():\n    await t.open_ssl_over_tcp_stream('h', 1)\n", "trio.open_ssl_over_tcp_stream"),
        ("from trio import socket\ndef f():\n    socket.socket().connect(('h', 1))\n", "trio.socket.socket"),
        ("import trio\ns = trio.socket.socket()\n", "trio.socket.socket"),
        ("import socket\nsocket.create_connection(('h', 1))\n", "socket.create_connection"),
        ("from socket import create_connection as cc\ncc(('h', 1))\n", "socket.create_connection"),
        ("import socket as s\nx = s.socket(s.AF_INET)\n", "socket.socket"),
        ("def f():\n    import httpx\n    return httpx.Client()\n", "httpx.Client"),
        ("from httpx import AsyncClient\nAsyncClient()\n", "httpx.AsyncClient"),
        ("import httpx\nhttpx.get('http://x')\n", "httpx.get"),
        ("import urllib.request\nurllib.request.urlopen('http://x')\n", "urllib.request.urlopen"),
        ("from urllib import request\nrequest.urlopen('http://x')\n", "urllib.request.urlopen"),
        ("import http.client as hc\nhc.HTTPSConnection('x')\n", "http.client.HTTPSConnection"),
        ("import asyncio\nasync def f():\n    await asyncio.open_connection('h', 1)\n", "asyncio.open_connection"),
        ("async def f(loop):\n    await loop.create_connection(object, 'h', 1)\n", "<object>.create_connection"),
        ("import requests\n", "requests"),
        ("import aiohttp\n", "aiohttp"),
        ("import trio\nopen_it = getattr(trio, 'open_tcp_stream')\n", "trio.open_tcp_stream"),
        ("import openai\nopenai.OpenAI()\n", "openai.OpenAI"),
    ],
)  # fmt: skip
def test_the_walker_flags_a_planted_opener(source, name):
    findings = openers_in(source, "docket/planted.py")
    assert name in {f.name for f in findings}, findings
    assert violations(findings), "a planted opener must be a violation"


def test_the_exemptions_are_narrow():
    # The door's own opener in another function of the same module is a violation...
    source = (
        "import trio\nasync def open_upstream_stream():\n    await trio.open_tcp_stream('h', 1)\n"
    )
    assert violations(openers_in(source, "docket/http/client.py")) == []
    moved = source.replace("open_upstream_stream", "helper")
    assert violations(openers_in(moved, "docket/http/client.py"))
    # ...and the agent may make its httpx client, not open raw sockets.
    agent = "import trio\nasync def run_agent():\n    await trio.open_tcp_stream('h', 1)\n"
    assert violations(openers_in(agent, "docket/agent/command.py"))


def test_listening_and_harmless_names_are_not_flagged():
    source = (
        "import trio, httpx, socket, sqlite3\n"
        "async def f():\n"
        "    await trio.open_tcp_listeners(0)\n"
        "    sqlite3.connect(':memory:')\n"
        "    httpx.Timeout(1.0)\n"
        "    socket.AF_INET\n"
        "    trio.socket.getaddrinfo\n"
    )
    assert openers_in(source, "docket/ok.py") == []
