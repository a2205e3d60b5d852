"""The keys that sign and check attestations: OpenSSH ed25519, the kind every user already has.

Why OpenSSH's formats: a user of `reproduce` has an ed25519 key for SSH (`~/.ssh/id_ed25519`),
and the people who check a run know a key by its `.pub` line or by the fingerprint OpenSSH prints
(`ssh-keygen -lf KEY.pub`: `SHA256:...`). So a key is read in those formats (PEM PKCS#8 ed25519
too), `reproduce keygen PATH` writes a fresh pair in them, and a signature names its key by that
fingerprint (the DSSE signature's keyid, a hint: the signature itself is what is checked). All
key handling is `cryptography`'s; nothing here is home-made crypto: the fingerprint is SHA-256 of
the key blob, as OpenSSH defines it.

Imported only by the attestation commands: `cryptography` stays out of the CLI's start-up.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import BadInput

if TYPE_CHECKING:  # imported where used: cryptography is not loaded at start-up
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

# The variable holding an encrypted key's passphrase when there is no terminal (its name only).
PASSPHRASE_ENV = "REPRODUCE_KEY_PASSPHRASE"  # noqa: S105 - a variable name, not a secret
KEY_ENV = "REPRODUCE_ATTEST_KEY"  # the default signing key, before ~/.ssh/id_ed25519
_HINT = "Make one with `reproduce keygen PATH`, or `ssh-keygen -t ed25519 -f PATH`."


def default_key_path() -> Path | None:
    """$REPRODUCE_ATTEST_KEY, else ~/.ssh/id_ed25519 when it exists, else None."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    home = Path(os.path.expanduser("~/.ssh/id_ed25519"))
    return home if home.is_file() else None


# a key file is a few hundred bytes; one found beside a stranger's files may be anything
_KEY_MAX_BYTES = 64 << 10


def _read(path: Path, what: str) -> bytes:
    from launcher.excerpt import open_regular

    try:
        with open_regular(Path(path), follow=True) as fh:
            data = fh.read(_KEY_MAX_BYTES + 1)
        if len(data) > _KEY_MAX_BYTES:
            raise BadInput(f"{what} {path} is larger than a key file ({_KEY_MAX_BYTES} bytes).")
        return data
    except FileNotFoundError:
        raise BadInput(f"{what} {path} does not exist.", hint=_HINT) from None
    except IsADirectoryError:
        raise BadInput(f"{what} {path} is a directory, not a key file.") from None
    except OSError as err:
        raise BadInput(f"{what} {path}: cannot read it: {err.strerror}.") from None


def _passphrase(path: Path) -> bytes:
    if os.environ.get(PASSPHRASE_ENV):
        return os.environ[PASSPHRASE_ENV].encode()
    if sys.stdin.isatty():
        return getpass.getpass(f"passphrase for {path}: ").encode()
    raise BadInput(
        f"signing key {path} is encrypted and there is no terminal to ask its passphrase.",
        hint=f"Set {PASSPHRASE_ENV}, or use a key without a passphrase kept for the purpose.",
    )


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519PrivateKey from an OpenSSH or PEM private key file; BadInput saying why not."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read(path, "signing key")
    loader = (
        serialization.load_ssh_private_key
        if b"BEGIN OPENSSH PRIVATE KEY" in data
        else serialization.load_pem_private_key
    )
    try:
        try:
            key = loader(data, password=None)
        except TypeError:  # encrypted: "Password was not given but private key is encrypted"
            key = loader(data, password=_passphrase(path))
    except (ValueError, TypeError) as err:
        raise BadInput(
            f"signing key {path} cannot be read as an OpenSSH or PEM private key ({err}).",
            hint=_HINT,
        ) from None
    except Exception as err:  # noqa: BLE001 - cryptography's unsupported-algorithm errors
        raise BadInput(f"signing key {path}: {type(err).__name__}: {err}.", hint=_HINT) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadInput(
            f"signing key {path} is a {type(key).__name__.replace('PrivateKey', '')} key; "
            "attestations are signed with ed25519 keys.",
            hint=_HINT,
        )
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519PublicKey from an OpenSSH `.pub` line (or a PEM public key); BadInput if not."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = _read(path, "public key")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_ssh_public_key(data.strip().splitlines()[0] if data else data)
    except (ValueError, IndexError) as err:
        raise BadInput(
            f"public key {path} is not an OpenSSH public key line (`ssh-ed25519 AAAA... "
            f"comment`, as in KEY.pub) nor a PEM public key ({err})."
        ) from None
    except Exception as err:  # noqa: BLE001 - cryptography's unsupported-algorithm errors
        raise BadInput(f"public key {path}: {type(err).__name__}: {err}.") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadInput(f"public key {path} is not an ed25519 key; attestations use ed25519.")
    return key


def public_line(public_key: Ed25519PublicKey, comment: str = "") -> str:
    """The OpenSSH `.pub` line of a public key (what `ssh-keygen -y` prints)."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return f"{raw} {comment}".strip()


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """OpenSSH's fingerprint, `SHA256:` + unpadded base64 of SHA-256 over the key's blob."""
    blob = base64.b64decode(public_line(public_key).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def keygen(path: Path, comment: str = "reproduce attestation key") -> tuple[Path, str]:
    """A new ed25519 pair: PATH (OpenSSH private key, mode 0600) and PATH.pub. Never overwrites.
    Returns (the .pub path, the fingerprint)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    pub = path.with_name(path.name + ".pub")
    for p in (path, pub):
        if p.exists() or p.is_symlink():
            raise BadInput(f"{p} exists; keygen never overwrites a key. Choose another PATH.")
    if not path.parent.is_dir():
        raise BadInput(f"{path.parent} is not a directory; cannot write the key {path}.")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(private)
        pub.write_text(public_line(key.public_key(), comment) + "\n")
    except OSError as err:
        path.unlink(missing_ok=True)
        raise BadInput(f"cannot write the key {path}: {err.strerror}.") from None
    return pub, fingerprint(key.public_key())
