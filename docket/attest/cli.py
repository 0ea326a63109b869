"""The attestation verbs' arguments (`docket keygen`, `docket attest`) and verify's
--attestation/--pubkey, kept here so docket/cli.py holds one small hunk for them.
Nothing here imports the cryptography package: each verb loads it when it runs."""

from __future__ import annotations

import argparse

from docket.errors import DocketError


def add_verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attestation",
        default=None,
        metavar="FILE",
        help="a DSSE envelope (docket attest) to check first: signature, payloadType, "
        "subjects' digests (spec/docket-attestation-1.md); RECEIPT may then be the run's folder",
    )
    p.add_argument(
        "--pubkey",
        default=None,
        metavar="FILE",
        help="the signer's public key (PEM), for --attestation",
    )


def attested_verify(args: argparse.Namespace) -> int:
    if not (args.attestation and args.pubkey):
        raise DocketError("--attestation and --pubkey go together (see docket verify --help)")
    if args.ledger:
        raise DocketError("--ledger is not taken with --attestation: the subjects name the ledger")
    from docket.attest.command import verify_attested_command  # per verb

    return verify_attested_command(args.receipt, args.attestation, args.pubkey, args.json)


def cmd_keygen(args: argparse.Namespace) -> int:
    from docket.attest.keys import keygen_command  # per verb

    return keygen_command(args.out)


def cmd_attest(args: argparse.Namespace) -> int:
    from docket.attest.command import attest_command  # per verb

    return attest_command(args.run, args.key, args.out)


KEYGEN_EXAMPLES = """\
examples:
  docket keygen --out ~/keys/docket-signer.pem   # and ~/keys/docket-signer.pem.pub
"""
ATTEST_EXAMPLES = """\
examples:
  docket attest run1 --key ~/keys/docket-signer.pem          # -> run1/attestation.dsse.json
  docket attest gameday-report --key ~/keys/docket-signer.pem
  docket verify run1 --attestation run1/attestation.dsse.json --pubkey docket-signer.pem.pub
"""


def add_attest_verbs(verbs) -> None:
    p = verbs.add_parser(
        "keygen",
        help="make an Ed25519 key pair for docket attest (PEM)",
        description="Write an Ed25519 key pair: FILE, the private key (PKCS#8 PEM, mode 0600), "
        "and FILE.pub, the public key (SubjectPublicKeyInfo PEM) to give whoever checks the "
        "runs. Never overwrites a file. Keep FILE where no run's agent can read it.",
        epilog=KEYGEN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", required=True, metavar="FILE", help="the private key (0600); FILE.pub beside it"
    )
    p.set_defaults(func=cmd_keygen)

    p = verbs.add_parser(
        "attest",
        help="sign a run's folder (or a game-day report's) as an in-toto statement",
        description="Sign a run's folder (ledger.jsonl, receipt.json; its receipt must verify) "
        "or a game-day report's (gameday.json, junit.xml): an in-toto Statement v1 over the "
        "files' SHA-256 digests, in a DSSE envelope signed with Ed25519 "
        "(spec/docket-attestation-1.md). Refuses a key file group or others can read.",
        epilog=ATTEST_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="the run's folder (ledger.jsonl, receipt.json) or a report's")
    p.add_argument("--key", required=True, metavar="FILE", help="the private key (mode 0600)")
    p.add_argument("--out", default=None, metavar="FILE", help="default RUN/attestation.dsse.json")
    p.set_defaults(func=cmd_attest)
