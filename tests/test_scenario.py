"""Scenario files: every shipped scenario loads; a bad one is refused naming file, line, reason."""

from __future__ import annotations

import pytest

from chaos.data.locate import folder as data_folder
from chaos.faults.schedule import FaultSchedule
from chaos.scenario import load_scenario
from docket.errors import InputError

# fleet-*.yaml are fleet scenarios, run by `python -m chaos.fleet` (tests/test_fleet_scenario.py)
SHIPPED = sorted(
    p.name
    for p in data_folder("scenarios").iterdir()
    if p.name.endswith(".yaml") and not p.name.startswith("fleet-")
)


def test_the_seven_scenarios_are_shipped():
    assert {
        "retry-storm.yaml", "partial-outage.yaml", "slow-provider.yaml",
        "partition.yaml", "flapping-provider.yaml", "disk-full.yaml", "cache-loop.yaml",
    } <= set(SHIPPED)  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_scenario_loads_with_its_seed_and_a_comment(name):
    path = data_folder("scenarios") / name
    scenario = load_scenario(path)
    assert scenario.seed is not None
    assert scenario.faults and scenario.agents
    assert path.read_text().startswith("# ")  # says what it shows
    assert scenario.max_wall_clock <= 30
    FaultSchedule.parse(scenario.seed, scenario.faults)  # a schedule the engine can run


def test_a_full_scenario_is_read_into_values(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "seed: 9\n"
        "faults: ['upstream:status(503,retry_after=1s)@20%']\n"
        "providers:\n"
        "  - {name: main, kind: anthropic, latency: 5ms, token_delay: 1ms, via_proxy: false}\n"
        "agents:\n"
        "  - {name: h, mode: hammer, provider: main, calls: 4, concurrency: 2, timeout: 2s,\n"
        "     max_tokens: 8, env: {DOCKET_AGENT_BACKOFF_BASE: '0.1'}}\n"
        "  - {name: mine, command: [python3, agent.py]}\n"
        "policy: {caps: {max_model_calls: 3}}\n"
        "max_wall_clock: 1m\n"
        "probe_every: 0\n"
    )
    s = load_scenario(path)
    assert s.seed == 9 and s.faults == ("upstream:status(503, retry_after=1s)@20%",)
    (p,) = s.providers
    assert (p.name, p.kind, p.latency, p.token_delay, p.via_proxy) == (
        "main", "anthropic", 0.005, 0.001, False
    )  # fmt: skip
    h, mine = s.agents
    assert h.settings() == {
        "DOCKET_AGENT_BACKOFF_BASE": "0.1", "DOCKET_AGENT_MODE": "hammer",
        "DOCKET_AGENT_CALLS": "4", "DOCKET_AGENT_CONCURRENCY": "2",
        "DOCKET_AGENT_TIMEOUT": "2", "DOCKET_AGENT_MAX_TOKENS": "8",
    }  # fmt: skip
    assert mine.mode is None and mine.command == ("python3", "agent.py")
    assert s.policy == {"caps": {"max_model_calls": 3}}
    assert (s.max_wall_clock, s.probe_every, s.source) == (60.0, 0.0, str(path))


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("seed: 1\nfaults: []\nbogus: 1\n", 3, "at bogus unknown key (known: seed, faults,"),
        ("probe_evry: 1s\n", 1, "at probe_evry unknown key (did you mean probe_every?)"),
        ("seed: -1\n", 1, "at seed must be between 0 and 9007199254740991, got -1"),
        (f"seed: {2**60}\n", 1, "at seed must be between 0 and 9007199254740991"),
        ("seed: 1.5\n", 1, "at seed must be a whole number, got 1.5"),
        ("faults:\n  - 'upstream:latency(2d)@20%'\n", 2, "column 19: unknown duration unit 'd'"),
        ("faults:\n  - 3\n", 2, "at faults[0] must be a fault text"),
        ("faults: ['net:down@5%']\n", 1, "net:down disables the whole proxy"),
        (
            "faults: ['net:latency(1s)']\nproviders: [{name: a, via_proxy: false}]\n",
            1,
            "net faults need a provider with via_proxy: true",
        ),
        ("faults: ['ledger:eio@seq 1', 'ledger:eio@seq 1']\n", 1, "fault listed twice"),
        ("max_wall_clock: 0s\n", 1, "at max_wall_clock must be a positive duration"),
        ("max_wall_clock: '10'\n", 1, "expected a unit (ms, s, m or h) after '10'"),
        ("probe_every: 2 hours\n", 1, "at probe_every must be a duration"),
        ("agents:\n  - {mode: sprint}\n", 2, 'at agents[0].mode must be "once" or "stream"'),
        ("agents:\n  - {mode: once, provider: nope}\n", 2, "no provider 'nope'"),
        ("agents:\n  - {mode: once, command: [x]}\n", 2, "give a mode or a command, not both"),
        ("agents:\n  - {env: {PATH: /tmp}}\n", 2, "must be a DOCKET_AGENT_* setting"),
        ("agents:\n  - {name: a}\n  - {name: a}\n", 3, "agent 'a' named twice"),
        ("providers:\n  - {kind: gemini}\n", 2, 'must be "openai" or "anthropic", got "gemini"'),
        ("policy:\n  caps: {max_usd: lots}\n", 2, "caps.max_usd"),
        ("policy:\n  providers: {}\n", 2, "filled in by the harness"),
        ("- a list\n", 1, "must be a mapping"),
        ("seed: [1\n", 2, "not valid YAML"),
    ],
)
def test_a_bad_scenario_is_one_line_naming_file_and_line(tmp_path, text, line, reason):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}:"), message
    assert reason in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "no such file"), (b"", "empty"), (b"\x00\x01\x02binary", "binary")],
)
def test_a_missing_empty_or_binary_file_is_refused(tmp_path, content, reason):
    path = tmp_path / "s.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as caught:
        load_scenario(path)
    assert str(path) in str(caught.value) and reason in str(caught.value)
