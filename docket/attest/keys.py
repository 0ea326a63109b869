"""Ed25519 key files: PKCS#8 PEM for the private key, SubjectPublicKeyInfo PEM beside it.

Node's crypto, Go's crypto/x509 and Python's `cryptography` all read these two PEM
forms with no other package, so one key pair serves the three verifiers.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from docket.errors import EXIT_OK, InputError

MAX_KEY_BYTES = 16 * 1024  # a PEM Ed25519 key is ~120 bytes; more is not a key file
PUBLIC_SUFFIX = ".pub"


def key_id(public: Ed25519PublicKey) -> str:
    """The keyid hint written in an envelope: sha256 of the raw 32-byte public key, hex.
    A hint only (DSSE): no verifier trusts it, each checks the key it was given."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with `mode` from its first byte (O_EXCL: never over another file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise InputError(f"{path}: already exists; keygen never overwrites a key") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot create ({exc.strerror})") from None
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits from a 0644 public key
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def keygen_command(out: str) -> int:
    """`docket keygen --out FILE`: FILE (private, 0600) and FILE.pub (public, 0644)."""
    private_path = Path(out)
    public_path = Path(out + PUBLIC_SUFFIX)
    for p in (private_path, public_path):
        if p.exists() or p.is_symlink():
            raise InputError(f"{p}: already exists; keygen never overwrites a key")
    if not private_path.parent.is_dir():
        raise InputError(f"{private_path.parent}: no such folder")
    key = Ed25519PrivateKey.generate()
    _write_new(private_path, private_pem(key), 0o600)
    try:
        _write_new(public_path, public_pem(key.public_key()), 0o644)
    except InputError:
        private_path.unlink()  # half a pair is no pair
        raise
    print(
        f"private key {private_path} (0600), public key {public_path}; keyid {key_id(key.public_key())}"
    )
    return EXIT_OK


def _read_key_file(path: str | os.PathLike, what: str, *, private: bool = False) -> bytes:
    """A key file's bytes, bounded; a private key's refused when group or others may
    read it (its mode read from the file opened, not from the name before it)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise InputError(f"{what} {p}: not a regular file")
            if private and mode & 0o077:
                raise InputError(
                    f"{what} {p}: mode {stat.S_IMODE(mode):04o} lets group or others read it; "
                    f"chmod 600 {p} (and keep it outside the run's reach)"
                )
            data = f.read(MAX_KEY_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{what} {p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{what} {p}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{what} {p}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_KEY_BYTES:
        raise InputError(f"{what} {p}: more than {MAX_KEY_BYTES} bytes; not a key file")
    return data


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The signing key, refused when its file is readable by group or others: a key
    others can read signs for them too."""
    p = Path(path)
    data = _read_key_file(p, "key", private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InputError(f"key {p}: not a PEM PKCS#8 private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"key {p}: a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InputError(f"public key {path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"public key {path}: a {type(key).__name__}, not an Ed25519 key")
    return key
