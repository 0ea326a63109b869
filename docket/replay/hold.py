"""The stand-in agent of the pytest plugin (docket/pytest_plugin.py).

`docket replay RUN -- python -m docket.replay.hold ENV_FILE RELEASE_FILE` (or `docket
run` when re-recording): writes the environment docket gives its agent (the base URLs
pointed at the boundary, the run token) to ENV_FILE, then waits until RELEASE_FILE
exists, and exits 0. The test process takes that environment and is the agent in
fact: its calls go through the boundary the run supervises. Standard library only, so
it starts fast.
"""

from __future__ import annotations

import json
import os
import sys
import time

POLL_SECONDS = 0.02
MAX_HOLD_SECONDS = 6 * 3600  # a forgotten hold still ends


def main(argv: list[str]) -> int:
    env_file, release = argv
    tmp = f"{env_file}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict(os.environ), f)
    os.replace(tmp, env_file)  # whole or absent: the plugin never reads half of it
    deadline = time.monotonic() + MAX_HOLD_SECONDS
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            print("docket hold: never released", file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
