"""Docket's envelopes, checked by an implementation that is not Docket's: securesystemslib's
DSSE Envelope and its Ed25519 key (the library in-toto and TUF use). It must accept the
good vector and reject the tampered ones, so Docket's PAE, base64 and key format are
DSSE's, not a private dialect that only Docket's three verifiers share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

dsse = pytest.importorskip("securesystemslib.dsse", reason="securesystemslib (the test extra)")
from cryptography.hazmat.primitives.serialization import load_pem_public_key  # noqa: E402
from securesystemslib.exceptions import VerificationError  # noqa: E402
from securesystemslib.signer import SSlibKey  # noqa: E402

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
PUBKEY = VECTORS / "attest-key" / "TEST-ONLY-ed25519.pem.pub"


def envelope(name: str) -> dsse.Envelope:
    return dsse.Envelope.from_dict(
        json.loads((VECTORS / name / "attestation.dsse.json").read_text())
    )


def sslib_key(keyid: str) -> SSlibKey:
    # securesystemslib matches a signature to a key by keyid: Docket's is a hint
    # (sha256 of the raw key), so the key is given the envelope's
    return SSlibKey.from_crypto(load_pem_public_key(PUBKEY.read_bytes()), keyid=keyid)


def test_securesystemslib_accepts_the_good_envelope():
    env = envelope("attest-ok")
    keyid = next(iter(env.signatures))
    accepted = env.verify([sslib_key(keyid)], 1)
    assert list(accepted) == [keyid]
    assert env.payload_type == "application/vnd.in-toto+json"
    assert json.loads(env.payload)["_type"] == "https://in-toto.io/Statement/v1"


@pytest.mark.parametrize("name", ["attest-edited-payload", "attest-wrong-key"])
def test_securesystemslib_rejects_a_tampered_envelope(name):
    env = envelope(name)
    keyid = next(iter(env.signatures))
    with pytest.raises(VerificationError):
        env.verify([sslib_key(keyid)], 1)


def test_securesystemslib_rejects_a_payload_type_changed_after_signing():
    env = envelope("attest-ok")
    env.payload_type = "application/json"  # PAE covers the type
    keyid = next(iter(env.signatures))
    with pytest.raises(VerificationError):
        env.verify([sslib_key(keyid)], 1)
