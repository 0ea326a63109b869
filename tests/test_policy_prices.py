"""A policy's [prices]: per-model price strings and a source, merged over the shipped
table at run start (the policy wins and the run's pricing provenance says so), listed
by `docket prices --policy`; a bad entry is one line, exit 2."""

from __future__ import annotations

import json
import os
import shlex
import sys
from decimal import Decimal

import pytest
import trio

from docket.cli import main
from docket.policy import PolicyError, policy_from_dict
from docket.pricing import default_price_table

EMBEDDING = {"input": "0.02", "output": "0", "source": "openai.com/api/pricing, read 2026-12-01"}


def test_merged_over_the_shipped_table_the_policy_winning():
    shipped = default_price_table()
    assert shipped.lookup("text-embedding-3-small") is None
    mini = shipped.lookup("gpt-4o-mini")
    assert mini is not None and mini.input != Decimal("9")
    p = policy_from_dict(
        {
            "prices": {
                "text-embedding-3-small": EMBEDDING,
                "gpt-4o-mini": {"input": "9", "output": "9.5", "cached_input": "1", "source": "s"},
            }
        },
        source="team.toml",
    )
    table = p.price_table()
    emb = table.lookup("text-embedding-3-small")
    assert emb is not None and emb.as_strings() == {
        "input": "0.02", "cached_input": "0.02", "output": "0"  # cached defaults to input
    }  # fmt: skip
    assert emb.provider == "policy"
    over = table.lookup("gpt-4o-mini-2024-07-18")  # a dated snapshot takes the policy's too
    assert over is not None and over.as_strings()["input"] == "9" and over.provider == "openai"
    assert table.lookup("gpt-4o") == shipped.lookup("gpt-4o")
    assert table.provenance.startswith(
        "policy team.toml [prices] (text-embedding-3-small: openai.com/api/pricing, read "
        "2026-12-01; gpt-4o-mini: s), over the shipped price of gpt-4o-mini; every other model: "
    )
    assert table.digest != shipped.digest
    assert p.digest() != policy_from_dict({}).digest()  # the prices are part of the rules
    assert policy_from_dict({}).price_table() is default_price_table()


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({**EMBEDDING, "input": 0.02}, "prices.m.input: must be a price string of USD per million"),
        ({**EMBEDDING, "input": "0.0001"}, "prices.m.input: must be a price string"),
        ({**EMBEDDING, "output": "-1"}, "prices.m.output: must be a price string"),
        ({"output": "1", "source": "s"}, "prices.m.input: is required"),
        ({"input": "1", "output": "1"}, "prices.m.source: is required"),
        ({**EMBEDDING, "source": "  "}, "prices.m.source: is required"),
        ({**EMBEDDING, "inptu": "1"}, "prices.m.inptu: unknown key (known: input, output,"),
        ("0.02", 'prices.m: must be a table ([prices."m"]), got "0.02"'),
    ],
)
def test_a_bad_entry_is_named(entry, problem):
    with pytest.raises(PolicyError) as caught:
        policy_from_dict({"prices": {"m": entry}}, source="docket.toml")
    message = str(caught.value)
    assert message.startswith(f"policy docket.toml: {problem}"), message
    assert "\n" not in message


def test_docket_prices_lists_the_merged_table_and_refuses_a_bad_one(tmp_path, capsys):
    good = tmp_path / "docket.toml"
    good.write_text('[prices."text-embedding-3-small"]\ninput = "0.02"\noutput = "0"\n'
                    'source = "the vendor page"\n')  # fmt: skip
    assert main(["prices", "--json", "--policy", str(good)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["models"]["text-embedding-3-small"]["input"] == "0.02"
    assert doc["provenance"].startswith(f"policy {good} [prices] (text-embedding-3-small: the")
    assert "gpt-4o" in doc["models"]  # the shipped table is still there
    assert main(["prices", "--policy", str(good)]) == 0
    out = capsys.readouterr().out
    assert "text-embedding-3-small (policy)" in out and "[prices]" in out
    bad = tmp_path / "bad.toml"
    bad.write_text('[prices.m]\ninput = 1\noutput = "1"\nsource = "s"\n')
    assert main(["prices", "--policy", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "prices.m.input: must be a price string" in err


async def test_a_model_priced_by_the_policy_passes_max_usd_and_verifies(
    stub_server, tmp_path, capsys
):
    """Two agents under max_usd: one calls a model only the policy prices (forwarded,
    charged at the policy's price), one a model priced nowhere (refused, as before)."""
    agent = f"{shlex.quote(sys.executable)} -m docket agent --mode once --model"
    folder = tmp_path / "run"
    with trio.fail_after(60):
        async with stub_server("openai", reply_tokens=6) as stub:
            policy = tmp_path / "docket.toml"
            policy.write_text(
                "[caps]\nmax_usd = 1.00\n"
                f'[providers.openai]\nkind = "openai"\nbase_url = "{stub.url}"\n'
                'key_env = "STUB_KEY"\n'
                '[prices."text-embedding-3-small"]\ninput = "0.02"\noutput = "0"\n'
                'source = "openai.com/api/pricing, read 2026-12-01"\n'
            )
            done = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "docket",
                    "run",
                    "--quiet",
                    "--policy",
                    str(policy),
                    "--ledger-dir",
                    str(folder),
                    "--",
                    "sh",
                    "-c",
                    f"{agent} text-embedding-3-small && {agent} priced-nowhere-1; exit 0",
                ],  # fmt: skip
                env={**os.environ, "STUB_KEY": "sk-stub"},
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            forwarded = len(stub.log)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert forwarded == 1  # the unpriced model never reached the provider
    assert "the call was refused" in err  # the second agent said so
    receipt = json.loads((folder / "receipt.json").read_text())
    assert receipt["pricing"]["unit_prices"] == {
        "text-embedding-3-small": {"input": "0.02", "cached_input": "0.02", "output": "0"}
    }
    assert receipt["pricing"]["provenance"].startswith(f"policy {policy} [prices] (text-emb")
    by_model = receipt["totals"]["by_model"]
    assert by_model["text-embedding-3-small"]["responses"] == 1
    assert by_model["text-embedding-3-small"]["cost_nusd"] == 7 * 20  # 7 input tokens at $0.02/M
    assert by_model["priced-nowhere-1"]["refused"] == 1
    capsys.readouterr()
    assert main(["verify", str(folder)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
