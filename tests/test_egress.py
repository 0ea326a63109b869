"""The egress rule, pure: exact hosts in one canonical form, ports, IP literals,
providers, and the tricks that must not get through. Property tests check the
rule against a plain model of it (a set of lower-case names)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary.wiring import egress_rule_for
from docket.guards.egress import (
    RULE_ALLOW,
    RULE_HOST,
    RULE_PORT,
    Allowed,
    Denied,
    EgressRule,
    canonical_host,
    parse_entry,
)
from docket.policy import PolicyError, policy_from_dict

ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
labels = st.builds(
    lambda first, rest: (first + rest).rstrip("-"),
    st.sampled_from(ALNUM),
    st.text(ALNUM + "-", max_size=8),
)
tlds = st.text(ALNUM[:26], min_size=2, max_size=6)  # letters: a last label is never a number
hostnames = st.builds(
    lambda parts, tld: ".".join([*parts, tld]), st.lists(labels, min_size=1, max_size=3), tlds
)
ports = st.integers(1, 65535)
entries = st.tuples(hostnames, st.none() | ports)


def spelled(entry: tuple[str, int | None]) -> str:
    host, port = entry
    return host if port is None else f"{host}:{port}"


def perturb(host: str, data) -> str:
    """The same host as a client might write it: any letter case, maybe a trailing dot."""
    upper = data.draw(st.lists(st.booleans(), min_size=len(host), max_size=len(host)))
    cased = "".join(c.upper() if up else c for c, up in zip(host, upper, strict=True))
    return cased + ("." if data.draw(st.booleans()) else "")


# ---------------------------------------------------------------- properties


@settings(deadline=None)
@given(allow=st.lists(entries, max_size=6), data=st.data())
def test_the_rule_agrees_with_a_plain_model_of_it(allow, data):
    rule = EgressRule.from_lists([spelled(e) for e in allow], {})
    listed_hosts = [h for h, _ in allow]
    if listed_hosts and data.draw(st.booleans()):
        host = data.draw(st.sampled_from(listed_hosts))
    else:
        host = data.draw(hostnames)
    port = data.draw(st.sampled_from([p for _, p in allow if p] or [443]) | ports)
    asked = perturb(host, data)

    expected = any(h == host and (p is None or p == port) for h, p in allow)
    decision = rule.check(asked, port)
    if expected:
        assert isinstance(decision, Allowed), decision
        assert (decision.host, decision.port) == (host, port)
        index = int(decision.rule.removeprefix("egress.allow[").removesuffix("]"))
        assert allow[index][0] == host and allow[index][1] in (None, port)
    else:
        assert isinstance(decision, Denied), decision
        assert decision.rule == RULE_ALLOW
        assert decision.host == host  # recorded in canonical form


@settings(deadline=None)
@given(listed=hostnames, label=labels)
def test_no_subdomain_prefix_or_suffix_rides_on_a_listed_host(listed, label):
    rule = EgressRule.from_lists([listed], {})
    for trick in (
        f"{label}.{listed}",
        f"{label}{listed}",
        f"{listed}.{label}x",
        f"{listed}{label}x",
    ):
        if trick == listed:
            continue
        decision = rule.check(trick, 443)
        assert isinstance(decision, Denied), (trick, decision)


@settings(deadline=None)
@given(
    listed=st.lists(st.ip_addresses(v=4), min_size=1, max_size=4),
    asked=st.ip_addresses(v=4),
    port=ports,
)
def test_an_ipv4_literal_matches_only_itself_in_any_spelling(listed, asked, port):
    rule = EgressRule.from_lists([str(a) for a in listed], {})
    decision = rule.check(str(asked), port)
    assert isinstance(decision, Allowed) == (asked in listed)
    # Spellings a resolver (inet_aton) reads as the same address are refused outright.
    a, b, c, d = asked.packed
    for other in (
        str(int(asked)),
        hex(int(asked)),
        f"{a}.{b}.{(c << 8) | d}",
        f"0x{a:x}.{b}.{c}.{d}",
    ):
        refused = rule.check(other, port)
        assert isinstance(refused, Denied) and refused.rule == RULE_HOST, (other, refused)


@settings(deadline=None)
@given(listed=st.ip_addresses(v=6), port=ports)
def test_an_ipv6_literal_matches_in_any_textual_form(listed, port):
    rule = EgressRule.from_lists([f"[{listed}]:{port}"], {})
    for form in (listed.compressed, listed.exploded, f"[{listed.exploded}]"):
        decision = rule.check(form, port)
        assert isinstance(decision, Allowed), (form, decision)
        assert decision.host == listed.compressed
    assert isinstance(rule.check(listed.compressed, port % 65535 + 1), Denied)


@settings(deadline=None)
@given(host=st.text(max_size=80), port=st.integers(-10, 70000) | st.booleans())
def test_check_is_total_and_allows_only_what_is_listed(host, port):
    rule = EgressRule.from_lists(["example.com", "127.0.0.1:8080", "xn--bcher-kva.de"], {})
    decision = rule.check(host, port)
    assert isinstance(decision, Allowed | Denied)
    if isinstance(decision, Allowed):
        assert decision.host in {"example.com", "127.0.0.1", "xn--bcher-kva.de"}
        assert decision.host.isascii()
    elif not (type(port) is int and 1 <= port <= 65535):
        assert decision.rule == RULE_PORT


@settings(deadline=None)
@given(host=st.text(alphabet="aZ09-.ßüÜ。．ｅ[]:", max_size=30))
def test_canonical_form_is_a_fixed_point(host):
    try:
        once = canonical_host(host)
    except ValueError:
        return
    assert canonical_host(once) == once
    assert once.isascii() and once == once.lower()


# ---------------------------------------------------------------- examples


RULE = EgressRule.from_lists(
    ["example.com", "api.example.io:8443", "[::1]:9000", "127.0.0.1:5000", "xn--bcher-kva.de"],
    {"openai": "https://api.openai.com/v1", "stub": "http://localhost:8080"},
)


@pytest.mark.parametrize(
    "host, port, rule, canonical",
    [
        ("example.com", 1, "egress.allow[0]", "example.com"),
        ("EXAMPLE.COM.", 443, "egress.allow[0]", "example.com"),
        ("api.example.io", 8443, "egress.allow[1]", "api.example.io"),
        ("0:0::1", 9000, "egress.allow[2]", "::1"),
        ("[::1]", 9000, "egress.allow[2]", "::1"),
        ("127.0.0.1", 5000, "egress.allow[3]", "127.0.0.1"),
        ("BÜCHER.de", 443, "egress.allow[4]", "xn--bcher-kva.de"),
        ("bücher。de", 80, "egress.allow[4]", "xn--bcher-kva.de"),  # ideographic full stop
        ("api.openai.com", 443, "provider.openai", "api.openai.com"),
        ("localhost", 8080, "provider.stub", "localhost"),
    ],
)
def test_allowed_examples(host, port, rule, canonical):
    assert RULE.check(host, port) == Allowed(canonical, port, rule)


@pytest.mark.parametrize(
    "host, port, rule, reason",
    [
        ("api.example.io", 443, RULE_ALLOW, "only api.example.io:8443 is allowed"),
        ("api.openai.com", 80, RULE_ALLOW, "only api.openai.com:443 is allowed"),
        ("www.example.com", 443, RULE_ALLOW, "not in [egress] allow"),
        ("example.com.evil.net", 443, RULE_ALLOW, "not in [egress] allow"),
        ("localhost", 8081, RULE_ALLOW, "only localhost:8080"),
        ("127.0.0.2", 5000, RULE_ALLOW, "not in [egress] allow"),
        ("::ffff:127.0.0.1", 5000, RULE_ALLOW, "not in [egress] allow"),  # an IP only if listed
        ("example.com..", 443, RULE_HOST, "not a valid host name"),
        (".example.com", 443, RULE_HOST, "not a valid host name"),
        ("*.example.com", 443, RULE_HOST, "not a valid host name"),
        ("example.com:443", 443, RULE_HOST, "not a valid host name"),
        ("exa mple.com", 443, RULE_HOST, "not a valid host name"),
        ("example.com\x00.evil", 443, RULE_HOST, "not a valid host name"),
        ("a" * 300, 443, RULE_HOST, "not a valid host name"),
        ("127.1", 5000, RULE_HOST, "another spelling"),
        ("2130706433", 5000, RULE_HOST, "another spelling"),
        ("127.000.000.001", 5000, RULE_HOST, "another spelling"),
        ("[127.0.0.1]", 5000, RULE_HOST, "not an IPv6 address"),
        ("\udcff.com", 443, RULE_HOST, "international"),
        ("example.com", 0, RULE_PORT, "not a TCP port"),
        ("example.com", 65536, RULE_PORT, "not a TCP port"),
    ],
)
def test_denied_examples(host, port, rule, reason):
    decision = RULE.check(host, port)
    assert isinstance(decision, Denied), decision
    assert decision.rule == rule
    assert reason in decision.reason
    assert len(decision.host) <= 255


@pytest.mark.parametrize(
    "entry, message",
    [
        ("*.example.com", "wildcards are not supported"),
        ("127.1", "another spelling"),
        ("example.com:0", "port must be 1-65535"),
        ("[::1", "unclosed ["),
        ("[::1]9000", "expected :port"),
        ("bad_name.com", "not a valid host name"),
    ],
)
def test_a_bad_entry_is_refused_by_name(entry, message):
    with pytest.raises(ValueError, match=r"egress\.allow\[3\]") as caught:
        parse_entry(entry, "egress.allow[3]")
    assert message in str(caught.value)


def test_from_policy_takes_the_allow_list_and_every_provider():
    policy = policy_from_dict(
        {
            "egress": {"allow": ["Pypi.org", "files.example.com:8443"]},
            "providers": {
                "openai": {"kind": "openai"},
                "local": {
                    "kind": "anthropic",
                    "base_url": "http://127.0.0.1:7001",
                    "key_env": "K",
                },
            },
        },
        source="<test>",
    )
    rule = egress_rule_for(policy)
    shown = sorted((e.rule, e.shown()) for e in rule.entries)
    assert shown == [
        ("egress.allow[0]", "pypi.org"),
        ("egress.allow[1]", "files.example.com:8443"),
        ("provider.local", "127.0.0.1:7001"),
        ("provider.openai", "api.openai.com:443"),
    ]
    assert isinstance(rule.check("127.0.0.1", 7001), Allowed)
    assert isinstance(rule.check("127.0.0.1", 7002), Denied)


def test_with_an_empty_allow_list_only_the_providers_are_reachable():
    rule = egress_rule_for(policy_from_dict({}, source="<test>"))
    assert {e.shown() for e in rule.entries} == {"api.openai.com:443", "api.anthropic.com:443"}
    assert isinstance(rule.check("api.anthropic.com", 443), Allowed)
    assert isinstance(rule.check("pypi.org", 443), Denied)


def test_the_policy_loader_refuses_a_wildcard_before_the_rule_sees_it():
    with pytest.raises(PolicyError, match=r"egress\.allow\[0\]"):
        policy_from_dict({"egress": {"allow": ["*.example.com"]}}, source="<test>")


def test_ip_entries_are_compared_as_addresses_not_text():
    rule = EgressRule.from_lists(["[0:0:0:0:0:0:0:1]"], {})
    assert rule.check("::1", 22) == Allowed("::1", 22, "egress.allow[0]")
    assert str(ipaddress.ip_address("::1")) == rule.entries[0].host
