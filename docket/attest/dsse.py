"""DSSE v1: the pre-authentication encoding, and an envelope's base64 read one way.

PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, LEN in ASCII
decimal without leading zeros; the signature is over PAE, never over the payload alone,
so a payload cannot be passed off as another type's.
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from docket.attest.keys import key_id

PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_ENVELOPE_BYTES = 1024 * 1024  # an envelope here is ~2 KiB; past 1 MiB it is not read


def pae(payload_type: str, body: bytes) -> bytes:
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def b64decode_canonical(text: str) -> bytes | None:
    """Base64 (standard or URL-safe alphabet, padded) whose bytes encode back to the same
    text, else None: one text per byte string, so the three verifiers read it alike."""
    standard = text.replace("-", "+").replace("_", "/")
    try:
        data = base64.b64decode(standard, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode("ascii") == standard else None


def sign_envelope(body: bytes, key: Ed25519PrivateKey, payload_type: str = PAYLOAD_TYPE) -> dict:
    signature = key.sign(pae(payload_type, body))
    return {
        "payload": base64.b64encode(body).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [
            {"keyid": key_id(key.public_key()), "sig": base64.b64encode(signature).decode("ascii")}
        ],
    }


def envelope_text(envelope: dict) -> str:
    return json.dumps(envelope, indent=2) + "\n"
