"""The attack suite in its quick form (`python -m chaos.attack --quick`), one test per family.

Each family drives Docket from outside (real processes, raw sockets on 127.0.0.1,
real files) and returns what it tried, how many got the good outcome, and one
reproduction per failure; the test wants every probe good and prints the
reproductions when one is not. `nox -s attack` runs the full form and prints the
figures. The parts of each family are tested on their own in test_attack_parts.py.
"""

from __future__ import annotations

import pytest

from chaos.attack import (
    Figures,
    attest,
    cache,
    diskfull,
    excluded,
    exhaustion,
    fleet,
    http,
    inputs,
    mutations,
    numbers,
    orphans,
    replay,
    secrets,
    snapshot,
)


def assert_all_good(figures: Figures, at_least: int) -> None:
    assert figures.tried >= at_least, f"{figures.family}: only {figures.tried} probes ran"
    if figures.good != figures.tried or figures.failures:
        shown = "\n".join(figures.failures)
        pytest.fail(
            f"{figures.family}: {figures.good} of {figures.tried} good; reproductions:\n{shown}"
        )


def test_malformed_http_is_answered_4xx_and_the_boundary_keeps_serving(tmp_path):
    figures = http.run(tmp_path, quick=True)
    assert_all_good(figures, at_least=60)  # good includes "still serving" after each probe
    assert figures.extra["still_serving"] == figures.tried


def test_every_ledger_and_receipt_mutation_is_detected_by_verify(tmp_path):
    assert_all_good(mutations.run(tmp_path, quick=True), at_least=300)


def test_number_forms_get_one_verdict_from_the_three_verifiers(tmp_path):
    figures = numbers.run(tmp_path, quick=True)
    assert_all_good(figures, at_least=24)
    # Which verifiers judged (a missing tool is skipped and named, never silently).
    assert "python" in figures.extra["verifiers"]
    assert len(figures.extra["verifiers"]) + len(figures.extra["skipped_verifiers"]) == 3


def test_no_planted_secret_reaches_a_byte_under_the_run_folder(tmp_path):
    figures = secrets.run(tmp_path, quick=True)
    assert_all_good(figures, at_least=30)
    assert figures.extra["bytes_of_secrets_found"] == 0


def test_bad_inputs_are_one_line_and_exit_2(tmp_path):
    assert_all_good(inputs.run(tmp_path, quick=True), at_least=8)  # one a kind; all: nox -s attack


def test_a_disk_filled_mid_run_ends_in_a_receipt_that_discloses_the_loss(tmp_path):
    reason = diskfull.cannot_run()
    if reason:
        pytest.skip(reason)
    assert_all_good(diskfull.run(tmp_path, quick=True), at_least=2)


def test_a_spoiled_shared_cache_store_is_never_served(tmp_path):
    figures = cache.run(tmp_path, quick=True)
    if figures.skipped:
        pytest.skip(figures.skipped)
    assert_all_good(figures, at_least=30)
    assert figures.extra["through_docket_run"] == 2


def test_connection_exhaustion_leaves_real_calls_answered_and_each_episode_recorded(tmp_path):
    figures = exhaustion.run(tmp_path, quick=True)
    assert_all_good(figures, at_least=10)
    # one event per episode, never one per connection
    assert figures.extra["pressure_events"] < figures.extra["connections_opened"] // 10


def test_the_snapshot_store_and_restore_hold_against_a_same_user_agent(tmp_path):
    assert_all_good(snapshot.run(tmp_path, quick=True), at_least=17)


def test_the_watch_on_excluded_roots_stays_bounded_and_inside(tmp_path):
    figures = excluded.run(tmp_path, quick=True)
    assert_all_good(figures, at_least=6)


def test_nothing_an_agent_leaves_outlives_its_run(tmp_path):
    figures = orphans.run(tmp_path, quick=True)  # the churning bombs: nox -s attack
    assert_all_good(figures, at_least=2)
    assert figures.extra["outlived"] == 0


def test_a_signed_run_attacked_by_its_carrier_gets_each_named_verdict(tmp_path):
    figures = attest.run(tmp_path, quick=True)
    # 4 readable key modes, then 7 cases through each verifier present (python always)
    assert_all_good(figures, at_least=4 + 7)
    assert "python" in figures.extra["verifiers"]
    assert len(figures.extra["verifiers"]) + len(figures.extra["skipped_verifiers"]) == 3
    # the documented limit, measured: a same-user agent reads a 0600 key it is told of
    assert figures.extra["same_user_read_0600_key"] is True


def test_a_planted_recording_is_refused_before_it_is_replayed(tmp_path):
    assert_all_good(replay.run(tmp_path, quick=True), at_least=9)


def test_a_fleet_budgets_dsn_is_kept_from_the_agent_and_the_cap_holds(tmp_path, fleet_dsn):
    figures = fleet.run(tmp_path, quick=True, dsn=fleet_dsn)
    assert_all_good(figures, at_least=5)
    assert figures.extra["calls_spent_nusd"] <= figures.extra["calls_cap_nusd"]
    assert figures.extra["calls_refused"].get("docket_fleet_unavailable", 0) > 0
    # Not held, and said so: an agent of the same user holding a DSN whose role has
    # rights on the tables owns the budget (held under a runs' role: the `role` probes).
    assert figures.extra["open"] and "raised the cap" in figures.extra["open"][0]
