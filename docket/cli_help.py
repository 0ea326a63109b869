"""The words of `docket VERB --help`: what each verb does, examples, and the agent's environment.

Kept out of cli.py so the parser stays a list of flags; `document(verbs)` gives
each subparser its description and an epilog of examples. Plain text, imported by
every `docket` invocation, so it imports nothing heavier than textwrap. The lists that
repeat the code's own (AGENT_MODES, GAMEDAY_PHASES, AGENT_ENV) are held to it by
tests/test_cli_help.py.
"""

from __future__ import annotations

import argparse
import textwrap

AGENT_MODES = ("once", "stream", "loop", "hammer", "backoff", "repeat")  # docket.agent.config.MODES
GAMEDAY_PHASES = (  # gamedays/NN-NAME.yaml, in order
    "upstream-failure",
    "upstream-latency",
    "circuit-breaker",
    "partition",
    "retry-storm",
    "runaway-loop",
    "ledger-pressure",
    "evidence-loss",
    "supervisor-killed",
)

# What `docket run` puts in the agent's environment (docket.run.child.child_env), and
# what it takes out. README.md's table says the same.
AGENT_ENV = """\
the agent's environment (set by docket run; the real provider keys never reach it):
  OPENAI_BASE_URL      http://127.0.0.1:PORT/NAME/v1 for an openai-kind provider NAME
                       (with several, the last in the policy)
  OPENAI_API_KEY       the run token (the boundary swaps in the real key upstream)
  ANTHROPIC_BASE_URL   http://127.0.0.1:PORT/NAME for an anthropic-kind provider NAME
  ANTHROPIC_API_KEY    the run token
  DOCKET_BOUNDARY_URL  http://127.0.0.1:PORT: the boundary (its /docket/* endpoints)
  DOCKET_RUN_TOKEN     the run token, for any other client (Authorization: Bearer, or x-api-key)
  HTTP_PROXY, HTTPS_PROXY, http_proxy, https_proxy
                       http://docket:TOKEN@127.0.0.1:PORT: other traffic goes through the
                       boundary's forward proxy, held to [egress] allow
  NO_PROXY, no_proxy   127.0.0.1:PORT (the boundary itself, reached directly)
  removed: every provider's key_env, the well-known provider key names (OPENAI_API_KEY's
  real value, ANTHROPIC_API_KEY, GEMINI_API_KEY, ...: docket/guards/keys.py) and [secrets]
  drop_env; everything else is inherited.
"""

# `docket --help`'s epilog. A verb's own help that names an exit code names one listed
# here, and for 1 (whose meaning is each verb's) the verb: tests/test_cli_help.py.
EXIT_CODES = """exit codes:
  0   ok
  1   a check failed (verify found a break, doctor found damage, selftest a check,
      restore a conflict), for diff, the two runs differ, for export, the endpoint
      did not take the run (unreachable, refused, timed out), for fleet, the database
      could not be reached, for replay, a request diverged under --on-miss fail (with
      --check: a recorded call was not replayed, or another was asked), or, for prune,
      the store was in use (its lock not had within 10 s: nothing removed) or an
      object could not be removed
  2   usage or input error (missing, empty, binary or malformed input)
  42  a supervised run was stopped by a cap or a ledger ceiling
  43  a supervised run lost evidence: fail_fast_evidence stopped it, its receipt
      could not be written in the run's folder (it went to stderr and ledger.fallback_dir),
      or processes of the run outlived it (its isolation failed: the ledger names them)
  70  internal error (a bug in docket: please report it)
"""

DESCRIPTIONS = {
    "verify": "Re-derive every claim of a receipt (totals, models, caps, evidence, exit) from "
    "its ledger, and name the first that fails with its seq and byte offset "
    "(spec/docket-receipt-1.md). Never writes to either file.",
    "doctor": "Classify a ledger file: clean, torn tail (a write cut short), corrupt line, chain "
    "break, seq gap, or locked by a live run; optionally move a torn tail aside.",
    "demo": "A tour of the recorder: a stub provider and the reference agent as real processes, "
    "a supervised run stopped by a call cap, then verify, a flipped byte, and doctor.",
    "selftest": "Run about twenty small real runs in this process: a boundary on 127.0.0.1 over a "
    "ledger in a temporary folder, in front of an upstream of its own; no network, no keys. "
    "Each check proves one mechanism (recording, auth, redaction, egress, breaker, rate "
    "limiter, bulkhead, deadlines, caps, a failed write, a clock step, receipts, tampering, "
    "torn tails, the spec's vectors) by reading back the bytes on disk.",
    "run": "Supervise an agent: start the boundary and the ledger, start COMMAND with its "
    "environment pointed at the boundary (below), enforce the policy, and end with a receipt "
    "beside the ledger. Exit: the agent's status, 42 when a cap stopped it, 43 when evidence "
    "was lost.",
    "fleet": "A budget shared by many runs on many machines, in PostgreSQL (docs/fleet.md): "
    "create or migrate its tables, set a budget's caps, show what is spent, leased and lapsed "
    "(per host, lease by lease), list its runs with their receipts' digests, settle a dead "
    "run's lapsed leases from its ledger (a live boundary on its host does it by itself). "
    "Exit 1 when the database cannot be reached.",
    "init": "Write a commented docket.toml listing every policy key with its default.",
    "prices": "Print the price table the caps and receipts use: its date, its provenance, and "
    "USD per million tokens per model. With --policy, a policy's [prices] merged over it, "
    "as a run under that policy charges.",
    "stub": "Serve a stub model provider on 127.0.0.1 for trying Docket offline: OpenAI-shaped "
    "(chat.completions, streaming, /v1/models) or Anthropic-shaped (messages). Prints its URL.",
    "chaos": "One supervised run under seeded faults (spec/fault-grammar.md) against stub "
    "providers behind a fault proxy, with the reference agent (--agent MODE) or your own "
    "(-- CMD). Prints the command that reproduces it.",
    "agent": "The reference agent: calls a boundary (or any OpenAI/Anthropic-shaped URL) in one "
    "of its modes and prints a JSON report. Settings from the environment; flags override.",
    "game-day": "Run the game-day phases (gamedays/*.yaml): each a supervised run under faults, "
    "judged from its ledger, receipt, metrics and stub logs; an HTML report, JSON and JUnit. "
    "With --agent-command your own agent takes the place each phase names for it, and the "
    "report adds findings about it (docs/gamedays.md).",
    "explain": "Name the patterns a run shows (runaway loop, retry storm, cache misses, fat "
    "context, premium models for small calls, concentration, policy denials, write scope), "
    "each with the seqs it rests on and its cost, costliest first. Reads the ledger only.",
    "diff": "Compare two runs by their receipts (each verified first): totals, per model and "
    "provider, errors, refusals, caps, faults, evidence and the price table. Exit 0 when "
    "equal, 1 when they differ, 2 on bad input.",
    "restore": "Put a --snapshot run's tree back as it was before the run. Prints the plan "
    "(what would be written, deleted, recreated) and changes nothing unless --apply; a path "
    "changed again after the run is a conflict, skipped unless --force. Never writes outside "
    "the snapshot's root; writes restore.json beside the evidence, never the ledger. "
    "--diff shows each change instead: a unified diff per text file (the snapshot's bytes "
    "against the file now), sizes and sha256 for a binary file or one over 1 MiB.",
    "prune": "Free the snapshot store's objects that no kept run references (a run is kept "
    "while its folder is: beside the store, named in the store's runs.jsonl, or under "
    "--runs DIR). --older-than and --max-size choose among them, oldest first. Lists what "
    "would go and the bytes freed; removes only with --apply, under the store's lock, never "
    "following a link out of the store. Exit 1 when the store is in use (its lock not had "
    "within 10 s: nothing removed) or an object could not be removed; 2 when a run's "
    "snapshot record cannot be read (nothing removed).",
    "show": "Print a ledger one line per event (seq, time, type, model, tokens, cost, status), "
    "filtered by type, provider, seq range or errors; --follow watches a live run. Streams: "
    "memory stays flat on any size.",
    "ls": "List the runs in a runs folder, newest first: started, run id, folder, duration, "
    "exit, calls, spend, refusals, and the receipt's state (complete, evidence incomplete, "
    "running, no receipt, receipt unreadable), read from each receipt as written (docket "
    "verify FOLDER re-derives it). A table at a terminal, plain columns in a pipe.",
    "export": "Send a finished run's record to an OpenTelemetry collector as OTLP/HTTP "
    "protobuf: one trace per run (the run's span, a span per model call with gen_ai.* "
    "attributes, refusals, breaker moves, faults and cap warnings as span events) and "
    "the token-usage and duration histograms. The ledger's chain is verified first; ids "
    "come from the run id and seq, so exporting twice gives the same trace. Message "
    "content is never sent. Exit 0 sent; 1 the endpoint did not take it (unreachable, "
    "refused or timed out: the ledger is fine, try again); 2 a broken ledger or a bad "
    "argument (nothing sent). docs/export.md has the mapping.",
}

EXAMPLES = {
    "verify": """\
examples:
  docket verify docket-runs/RUN                        # its receipt.json, the ledger it names
  docket verify run/receipt.json                       # the same, named by the receipt
  docket verify run/receipt.json --ledger copy.jsonl   # another copy of it
  docket verify run/receipt.json --json | jq .verdict  # ok | fail | input_error
""",
    "doctor": """\
examples:
  docket doctor docket-runs/RUN                           # or run/ledger.jsonl, run/receipt.json
  docket doctor run/ledger.jsonl --json
  docket doctor run/ledger.jsonl --quarantine-torn-tail   # keep the readable prefix
""",
    "demo": """\
examples:
  docket demo
  docket demo --dir /tmp/docket-demo   # keep what it wrote
""",
    "selftest": """\
examples:
  docket selftest                      # progress, then a table; exit 0 if all passed, else 1
  docket selftest --json | jq .failed  # one JSON object: ok, passed, failed, seconds, checks
  docket selftest --only caps --only breaker
""",
    "run": """\
examples:
  docket run -- python my_agent.py
  docket run --policy docket.toml --ledger-dir runs/today -- ./agent.sh --task fix-tests
  docket run --max-wall-clock 600 --budget-mode quota -- claude -p "fix the tests"
  docket run --snapshot --rollback-on-breach -- python my_agent.py   # tree back on a breach
""",
    "fleet": """\
examples:
  export DOCKET_FLEET_DSN="host=db.internal dbname=docket user=docket"   # password: ~/.pgpass
  docket fleet init --runs-role docket_runs   # runs connect as docket_runs: lease functions only
  docket fleet budget set team-a --max-usd 50 --max-calls 10000
  docket fleet status team-a --json                 # per host; leases in their last quarter marked
  docket fleet runs team-a --limit 20               # each run: host, spend, state, receipt sha256
  docket fleet settle team-a --ledger docket-runs/RUN_ID   # another host's dead run
  docket fleet --policy docket.toml status team-a     # the DSN from its [fleet] table
""",
    "init": """\
examples:
  docket init                    # ./docket.toml
  docket init policies/ci.toml --force
""",
    "prices": """\
examples:
  docket prices
  docket prices --json | jq '.models["gpt-4o-mini"]'
  docket prices --policy docket.toml      # with its [prices] over the shipped table
""",
    "stub": """\
examples:
  docket stub --kind openai --port 8900
  docket stub --kind anthropic --latency 200ms --token-delay 20ms --log stub.jsonl
""",
    "chaos": f"""\
agent modes (--agent): {", ".join(AGENT_MODES)}

examples:
  docket chaos --seed 7 --fault "upstream:status(503, retry_after=1s)@20%" --agent backoff
  docket chaos --scenario scenarios/partition.yaml
  docket chaos --seed 7 --fault "upstream:latency(2s)@50%" -- python my_agent.py
""",
    "agent": f"""\
modes (--mode): {", ".join(AGENT_MODES)}

examples:
  docket run -- docket agent --mode loop --calls 20
  docket agent --mode once --base-url http://127.0.0.1:8900/v1
  docket run --policy cached.toml -- docket agent --mode repeat --temperature 0
""",
    "game-day": f"""\
{textwrap.fill("phases (--phase): " + ", ".join(GAMEDAY_PHASES), 78, subsequent_indent="  ")}

examples:
  docket game-day                                  # all nine; ./gameday-report/index.html
  docket game-day --phase circuit-breaker --phase partition --seed 7
  docket game-day --toxiproxy http://127.0.0.1:8474 --report out/
  docket game-day --agent-command "python my_agent.py" --policy docket.toml
  docket game-day --agent-findings fail -- python my_agent.py --fast
""",
    "explain": """\
examples:
  docket explain runs/today                 # a run's folder, its ledger.jsonl or receipt.json
  docket explain runs/today --json | jq '.findings[].pattern'
  docket explain runs/today --policy docket.toml   # its [explain] thresholds
""",
    "diff": """\
examples:
  docket diff runs/yesterday runs/today              # two run folders
  docket diff yesterday/receipt.json today/receipt.json
  docket diff a/receipt.json b/receipt.json --json
""",
    "restore": """\
examples:
  docket restore docket-runs/RUN                 # the plan only
  docket restore docket-runs/RUN --apply
  docket restore docket-runs/RUN --apply --only src/app.py --force
  docket restore docket-runs/RUN --diff          # what --apply would change, as diffs
""",
    "prune": """\
examples:
  docket prune                                   # docket-runs/.docket-snapshot-store
  docket prune --older-than 168h --max-size 10GiB
  docket prune /data/store --runs /data/runs --apply
""",
    "ls": """\
examples:
  docket ls                        # ./docket-runs
  docket ls runs/ --json | jq '.runs[0].folder'
""",
    "show": """\
examples:
  docket show runs/today --errors
  docket show runs/today/ledger.jsonl --type model.error --seq 100..200
  docket show runs/today --follow            # until the run's session.end
""",
    "export": """\
examples:
  docket export otel docket-runs/RUN                     # to http://127.0.0.1:4318
  docket export otel docket-runs/RUN --endpoint http://collector:4318 \\
      --header "Authorization=Bearer $TOKEN"
  docket export otel run/ledger.jsonl --policy docket.toml   # with server.address/port
""",
}


def document(verbs: argparse._SubParsersAction) -> None:
    """Give each known verb's parser its description and examples (run: its environment)."""
    for name, parser in verbs.choices.items():
        if name in DESCRIPTIONS:
            parser.description = DESCRIPTIONS[name]
        if name in EXAMPLES:
            parser.epilog = EXAMPLES[name] + ("\n" + AGENT_ENV if name == "run" else "")
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
