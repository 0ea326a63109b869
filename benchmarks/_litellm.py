"""LiteLLM's proxy as a peer to measure against: found, configured, started, stopped.

LiteLLM is not a dependency of Docket: `nox -s peers` installs `litellm[proxy]`
from PyPI into its own virtualenv (pinned there). Here it is run the way its
docs run it (`litellm --config FILE`), with the least it needs to forward a call:
one model routed to our stub, a master key, no database, no callbacks, no
telemetry, the model price map read from the package (not fetched), bound to
127.0.0.1 only, one worker (one process, as Docket's boundary is).

The executable is $DOCKET_PEERS_LITELLM, else `litellm` beside this Python,
else on PATH. When there is none, `find_litellm` says why, and the benchmarks
measure Docket alone and write that reason into their report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _harness as h

LITELLM_ENV = "DOCKET_PEERS_LITELLM"
MASTER_KEY = "sk-docket-peers-master"
MODEL = "gpt-4o-mini"
CHAT_PATH = "/v1/chat/completions"

# Settings that keep the proxy off the network and off any store: the price map from
# the installed package, no telemetry, no update checks. No DATABASE_URL is set.
QUIET_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    "DISABLE_ADMIN_UI": "True",
    "NO_DOCS": "True",
    "NO_PROXY": "127.0.0.1,localhost",
}


def find_litellm() -> tuple[str | None, str]:
    """(the litellm executable, or None; where it came from, or why there is none)."""
    named = os.environ.get(LITELLM_ENV)
    if named:
        if os.access(named, os.X_OK):
            return named, f"${LITELLM_ENV}"
        return None, f"${LITELLM_ENV}={named} is not an executable file"
    beside = Path(sys.executable).parent / "litellm"
    if os.access(beside, os.X_OK):
        return str(beside), "beside this Python"
    found = shutil.which("litellm")
    if found:
        return found, "on PATH"
    return None, (
        "LiteLLM is not installed here (no `litellm` beside this Python or on PATH, "
        f"no ${LITELLM_ENV}): `nox -s peers` installs litellm[proxy] from PyPI"
    )


def litellm_version(executable: str) -> str:
    """The installed litellm's version, read by the Python that runs it."""
    python = Path(executable).parent / "python"
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return out.stdout.strip()


def config_yaml(stub_url: str) -> str:
    """One model, routed to the stub (JSON is YAML, so no YAML writer is needed)."""
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": stub_url.rstrip("/") + "/v1",
                    "api_key": "sk-docket-bench",
                },
            }
        ],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"telemetry": False, "callbacks": [], "success_callback": []},
    }
    return json.dumps(config, indent=2) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((h.LOOPBACK, 0))
        return int(sock.getsockname()[1])


class LiteLLMProxy:
    """`litellm --config FILE --host 127.0.0.1 --port N` in its own process group,
    ready once a call through it answers 200; `stop()` ends the group."""

    def __init__(
        self, executable: str, stub_url: str, folder: Path, *, startup_s: float = 180.0
    ) -> None:
        config = folder / "litellm-config.yaml"
        config.write_text(config_yaml(stub_url))
        self.log_path = folder / "litellm.log"
        self.port = free_port()
        self.url = f"http://{h.LOOPBACK}:{self.port}"
        env = {**os.environ, **QUIET_ENV}
        env.pop("DATABASE_URL", None)
        argv = [executable, "--config", str(config), "--host", h.LOOPBACK, "--port"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*argv, str(self.port), "--num_workers", "1"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=folder,
                start_new_session=True,  # its own group: stop() reaches any child it starts
            )
        try:
            self._wait_ready(startup_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, startup_s: float) -> None:
        """Until one chat call through the proxy answers 200 (its port opens before
        its router is ready), or the process exits, or startup_s passes."""
        body = h.chat_body(stream=False)
        request = h.request_bytes(self.url, CHAT_PATH, MASTER_KEY, body)
        deadline = time.monotonic() + startup_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"litellm exited with status {self.process.returncode} while starting: "
                    f"{self.log_tail()}"
                )
            try:
                conn = h.Connection(self.url)
                try:
                    status, _, answer = conn.call(request)
                finally:
                    conn.close()
                if status == 200:
                    return
                last = f"status {status}: {answer[-300:]!r}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise RuntimeError(f"litellm not ready within {startup_s:g}s ({last}): {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to its process group, then SIGKILL if it lingers past timeout_s."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(
                f"litellm: still running {timeout_s:g} s after SIGTERM: SIGKILL to its group",
                file=sys.stderr,
            )
        try:  # the leader may be gone while a child it started lingers in the group
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return  # the whole group is gone: nothing lingers, and the leader was reaped above
        self.process.wait(timeout=10)

    def __enter__(self) -> LiteLLMProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
