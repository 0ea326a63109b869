"""Signed attestations of a run: an in-toto Statement v1 in a DSSE envelope, Ed25519
(spec/docket-attestation-1.md)."""
