"""A signed statement of what a run directory holds: in-toto Statement v1 in a DSSE envelope.

Why these formats (docs/attestation.md): an in-toto Statement is the supply chain's common shape
for "these files, by sha256, and this typed claim about them", and a DSSE envelope signs its exact
bytes (with the payload type, against confusion attacks) so that verifiers never re-serialize
anything. cosign, in-toto's tools and sigstore all read the pair.

What is whose: the ed25519 signature and key handling are `cryptography`'s (no home-made
crypto). The DSSE envelope itself is JSON and a fixed byte encoding (PAE, a dozen lines of the
spec), written here: securesystemslib's DSSE, the in-toto project's own, imports its whole signer
package on first use, which pulls boto3 and tries the cloud-KMS libraries: half a second to a
second on every `verify`, which must take well under one. The tests check both directions
against securesystemslib's DSSE and in-toto's verifier (an envelope signed here verifies there,
one signed there verifies here). The Statement is a small JSON document built here too:
in-toto-attestation's binding keeps a predicate as a protobuf Struct, which turns every integer
into a double (a token count over 2^53 would change), and a figure that must verify exactly
cannot go through that; the tests parse the Statement with that binding and validate it.

The subjects are every regular file of the directory except what is written after, or about,
the attestation (ATTESTATION_FILES, report.html which shows it, hidden files such as the follow
lock). A link or a special file in the directory is refused: its bytes are not the directory's.

A bundle is one gzip-compressed tar of the envelope, its public key and the subjects under one
top directory; `verify` reads it as a stream into a temporary directory, refusing absolute names,
`..`, links and anything but plain files and directories, and writes a subject only after the
envelope's signature held, only one its statement names and only at its attested size.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput, CheckFailed
from launcher.records import jsonread
from launcher.records.rundir import Files

if TYPE_CHECKING:  # imported where used: cryptography is not loaded at start-up
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # the DSSE payloadType of in-toto statements
PREDICATE_TYPE = "https://reproduce.dev/attestation/run/v1"  # docs/attestation.md
ENVELOPE_FILE = Files.ATTESTATION
PUB_FILE = (
    Files.ATTESTATION_PUB
)  # the signer's OpenSSH public key line (a hint, never trusted alone)
ATTESTATION_FILES = frozenset({ENVELOPE_FILE, PUB_FILE})
NOT_EVIDENCE = ATTESTATION_FILES | {
    Files.REPORT_HTML
}  # the page shows the attestation: written after
BUNDLE_MAX_BYTES = 8 << 30  # a bundle larger than this unpacked is refused (a tar bomb)
BUNDLE_MAX_MEMBERS = 100_000


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def evidence_files(root: Path) -> list[str]:
    """The directory's evidence: every regular file (relative POSIX paths, sorted) but
    NOT_EVIDENCE and hidden files. BadInput for a link or a special file anywhere in it."""
    root = Path(root)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in list(dirnames):
            if (base / name).is_symlink():
                raise BadInput(
                    f"{base / name} is a symbolic link: an attested directory holds only its own "
                    "files."
                )
            if name.startswith("."):
                dirnames.remove(name)
        for name in filenames:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if name.startswith(".") or rel in NOT_EVIDENCE:
                continue
            if path.is_symlink() or not path.is_file():
                raise BadInput(
                    f"{path} is a link or not a regular file: an attested directory holds only "
                    "its own regular files."
                )
            found.append(rel)
    return sorted(found)


def subjects_of(root: Path, names: list[str]) -> list[dict[str, Any]]:
    """Each file by name, sha256 and size in bytes (an in-toto ResourceDescriptor's
    `annotations`): `verify` of a bundle extracts a subject only up to its attested size."""
    return [
        {
            "name": n,
            "digest": {"sha256": sha256_file(Path(root) / n)},
            "annotations": {"size": (Path(root) / n).stat().st_size},
        }
        for n in names
    ]


def attested_size(subject: dict[str, Any]) -> int | None:
    """A subject's attested size in bytes, or None when its statement records none."""
    notes = subject.get("annotations")
    size = notes.get("size") if isinstance(notes, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= BUNDLE_MAX_BYTES:
        return size
    return None


def statement(subjects: list[dict[str, Any]], predicate: dict[str, Any]) -> dict[str, Any]:
    """An in-toto Statement v1 (github.com/in-toto/attestation, spec/v1/statement.md)."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def payload_bytes(stmt: dict[str, Any]) -> bytes:
    """The statement's bytes as signed: strict JSON (no NaN), keys sorted, UTF-8."""
    return json.dumps(stmt, sort_keys=True, allow_nan=False, ensure_ascii=False).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, what is signed (DSSE spec v1.0, protocol.md):
    "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, lengths in ASCII decimal bytes."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def sign(stmt: dict[str, Any], private_key: Ed25519PrivateKey) -> dict[str, Any]:
    """The DSSE envelope (as JSON) of `stmt`, signed with an ed25519 private key; the
    signature's keyid is the key's OpenSSH fingerprint."""
    from launcher.results.attest_keys import fingerprint

    body = payload_bytes(stmt)
    signature = private_key.sign(pae(PAYLOAD_TYPE, body))  # cryptography's Ed25519
    return {
        "payload": base64.b64encode(body).decode(),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [
            {
                "keyid": fingerprint(private_key.public_key()),
                "sig": base64.b64encode(signature).decode(),
            }
        ],
    }


def signer_ids(envelope: dict[str, Any]) -> list[str]:
    """The keyids (OpenSSH fingerprints) the envelope's signatures name (unauthenticated)."""
    sigs = envelope.get("signatures") if isinstance(envelope, dict) else None
    return [str(s.get("keyid")) for s in sigs or [] if isinstance(s, dict) and s.get("keyid")]


def read_envelope(path: Path) -> dict[str, Any]:
    """The envelope file as JSON; BadInput when there is none, CheckFailed when it is not one."""
    try:  # bounded (launcher/records/jsonread.py): an envelope in a bundle is a stranger's
        data = jsonread.load_file(Path(path))
    except jsonread.NodeJSONError as err:
        raise CheckFailed(f"{path} is not a DSSE envelope ({err.message}).") from None
    if data is None:
        raise BadInput(
            f"{path} does not exist: the directory is not attested (`reproduce attest RUN`)."
        )
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("payload"), str)
        or not isinstance(data.get("signatures"), list)
    ):
        raise CheckFailed(f"{path} is not a DSSE envelope (payload, payloadType, signatures).")
    return data


def _b64(text: object) -> bytes | None:
    """Standard or URL-safe base64 (DSSE accepts both), or None when it is neither."""
    if not isinstance(text, str):
        return None
    try:
        alphabet = text.replace("-", "+").replace("_", "/")
        return base64.b64decode(alphabet + "=" * (-len(alphabet) % 4), validate=True)
    except ValueError:
        return None


def open_envelope(
    envelope: dict[str, Any], public_key: Ed25519PublicKey, where: Path
) -> dict[str, Any]:
    """Check the envelope's signature with `public_key`, then return its Statement.

    Every signature is tried against the key (a keyid is only a hint, per DSSE). CheckFailed
    naming what does not hold: another key signed it, or its bytes changed after signing (the
    predicate or a subject's digest edited)."""
    from cryptography.exceptions import InvalidSignature

    from launcher.results.attest_keys import fingerprint

    want = fingerprint(public_key)
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise CheckFailed(
            f"{where}: payloadType is {envelope.get('payloadType')!r}, not {PAYLOAD_TYPE!r}."
        )
    body = _b64(envelope.get("payload"))
    if body is None:
        raise CheckFailed(f"{where}: the payload is not base64.")
    signed = pae(PAYLOAD_TYPE, body)
    good = False
    for entry in envelope["signatures"]:
        sig = _b64(entry.get("sig")) if isinstance(entry, dict) else None
        if sig is None:
            continue
        try:
            public_key.verify(sig, signed)  # cryptography's Ed25519
            good = True
            break
        except InvalidSignature:
            continue
    if not good:
        ids = signer_ids(envelope)
        if ids and want not in ids:
            raise CheckFailed(
                f"{where}: signed by {', '.join(ids)}, not by the key given ({want})."
            )
        raise CheckFailed(
            f"{where}: the signature by {want} does not verify over the envelope's payload: the "
            "statement (its predicate or a subject's digest) was changed after it was signed, "
            "or another key made the signature."
        )
    try:  # signed, but by whoever holds the key: bounded all the same
        stmt = jsonread.loads(body.decode("utf-8", errors="replace"))
    except jsonread.NodeJSONError as err:
        raise CheckFailed(f"{where}: the signed payload is not JSON ({err.message}).") from None
    problem = statement_problem(stmt)
    if problem or not isinstance(stmt, dict):
        raise CheckFailed(f"{where}: {problem}")
    return stmt


def statement_problem(stmt: object) -> str | None:
    """Why `stmt` is not a Statement v1 of our predicate type, or None."""
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        return f"the payload is not an in-toto Statement ({STATEMENT_TYPE})."
    if stmt.get("predicateType") != PREDICATE_TYPE:
        return (
            f"predicateType is {stmt.get('predicateType')!r}; this launcher verifies "
            f"{PREDICATE_TYPE}."
        )
    subjects = stmt.get("subject")
    if not isinstance(subjects, list) or not subjects:
        return "the statement has no subjects."
    for s in subjects:
        name = s.get("name") if isinstance(s, dict) else None
        digests = s.get("digest") if isinstance(s, dict) else None
        digest = digests.get("sha256") if isinstance(digests, dict) else None
        if not isinstance(name, str) or not isinstance(digest, str) or not safe_name(name):
            return f"subject {str(s)[:200]} is not a relative file name with a sha256 digest."
    if not isinstance(stmt.get("predicate"), dict):
        return "the statement has no predicate object."
    return None


def safe_name(name: str) -> bool:
    """A relative POSIX path inside its directory: not absolute, no `..`, no empty parts."""
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        return False
    parts = PurePosixPath(name).parts
    return all(p not in ("", ".", "..") for p in parts) and not name.endswith("/")


# --- bundles ---------------------------------------------------------------------------------


def write_bundle(root: Path, names: list[str], out: Path) -> Path:
    """One .tar.gz of the envelope, the public key and `names` under `<root's name>/`."""
    root = Path(root)
    top = root.name or "run"
    out = Path(out)
    if out.exists():
        raise BadInput(f"{out} exists; a bundle is never overwritten. Choose another --out.")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name in [ENVELOPE_FILE, PUB_FILE, *names]:
                path = root / name
                if not path.is_file():
                    continue
                info = tar.gettarinfo(str(path), arcname=f"{top}/{name}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"cannot write the bundle {out}: {err.strerror or err}.") from None
    return out


def is_bundle(path: Path) -> bool:
    return Path(path).is_file() and tarfile.is_tarfile(path)


def _members(tar: tarfile.TarFile, bundle: Path) -> Iterator[tarfile.TarInfo]:
    """Each entry, as it comes (a stream: nothing of an entry is read before it is taken),
    refused unless it is a plain file or directory with a relative name inside the bundle."""
    for n, member in enumerate(tar):
        if n >= BUNDLE_MAX_MEMBERS:
            raise BadInput(f"{bundle}: more than {BUNDLE_MAX_MEMBERS} entries; not a bundle.")
        if not safe_name(member.name.rstrip("/") if member.isdir() else member.name):
            raise BadInput(
                f"{bundle}: entry {member.name!r} is an absolute path or leaves the bundle "
                "(`..`); refused, nothing extracted."
            )
        if not (member.isfile() or member.isdir()):
            raise BadInput(
                f"{bundle}: entry {member.name!r} is a link or a special file; a bundle holds "
                "only plain files. Refused."
            )
        yield member


# The envelope and the key come first in a bundle (write_bundle), each at most this large (the
# JSON reader's own bound: launcher/records/jsonread.py).
ENVELOPE_MAX_BYTES = 4 << 20
# What a tar stream may hold beyond the attested bytes: a header and its padding per entry.
_PER_ENTRY = 3 << 10


class _Unpack:
    """One bundle read as a stream, in one pass, and written only as its signature allows.

    First the envelope and its key (the first entries, each at most ENVELOPE_MAX_BYTES); then the
    signature is checked (the key given, else the one found beside it) and the statement read;
    from there on an entry is written only when the signed statement names it as a subject, at
    exactly its attested size, and the stream may not run past the attested bytes (plus a header
    per entry). So a bundle of a few megabytes that unpacks to gigabytes writes nothing but its
    envelope unless its signed statement names those gigabytes, and an entry the statement does
    not name is refused before any of its bytes are read."""

    def __init__(self, bundle: Path, into: Path, key: Path | None) -> None:
        self.bundle, self.into, self.key = bundle, into, key
        self.top: str | None = None
        self.sizes: dict[str, int] | None = None  # subject -> attested size, once signed
        self.budget = 0  # where the stream must end by (bytes of the tar, unpacked)
        self.written: set[str] = set()

    def run(self) -> Path:
        from launcher.excerpt import open_regular

        # a regular file only (a FIFO would block the open for ever); the user named it
        with (
            open_regular(self.bundle, follow=True) as raw,
            tarfile.open(fileobj=raw, mode="r|*") as tar,
        ):
            for member in _members(tar, self.bundle):
                self._take(tar, member)
        if self.top is None:
            raise BadInput(
                f"{self.bundle}: a bundle holds one directory with {ENVELOPE_FILE} in it "
                "(`reproduce bundle RUN` writes one)."
            )
        if self.sizes is None:
            self._signed()
        return self.into / self.top

    def _take(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = PurePosixPath(member.name.rstrip("/")).parts
        if self.top is None:
            self.top = parts[0]
        if parts[0] != self.top:
            raise BadInput(
                f"{self.bundle}: entry {member.name!r} is outside the bundle's one directory "
                f"{self.top}/; refused."
            )
        if member.isdir():
            return  # directories are made for the files in them, never for themselves
        rest = "/".join(parts[1:])
        if self.sizes is None and rest in ATTESTATION_FILES and rest not in self.written:
            if member.size > ENVELOPE_MAX_BYTES:
                raise BadInput(
                    f"{self.bundle}: {rest} is {member.size} bytes, more than an attestation "
                    f"holds ({ENVELOPE_MAX_BYTES}); refused."
                )
            self._write(tar, member, rest)
            self.budget = member.offset_data + member.size
            return
        if self.sizes is None:
            self._signed()
        assert self.sizes is not None
        if rest in self.written:
            raise BadInput(f"{self.bundle}: {rest} appears twice; refused.")
        size = self.sizes.get(rest)
        if size is None:
            raise BadInput(
                f"{self.bundle}: entry {member.name!r} is not a subject of its signed statement "
                "(a bundle holds the attestation, its key and the subjects only); refused, "
                "not extracted."
            )
        if member.size != size:
            raise CheckFailed(
                f"{self.bundle}: {rest} changed since it was attested ({size} bytes attested, "
                f"{member.size} in the bundle); not extracted."
            )
        if member.offset_data + member.size > self.budget:
            raise BadInput(
                f"{self.bundle}: holds more than its signed statement names; refused at {rest}."
            )
        self._write(tar, member, rest)

    def _signed(self) -> None:
        """Check the envelope's signature; the subjects' attested sizes from its statement."""
        from launcher.results.attest_keys import load_public_key

        root = self.into / (self.top or "run")
        if ENVELOPE_FILE not in self.written:
            raise BadInput(
                f"{self.bundle}: a bundle starts with its {ENVELOPE_FILE} (`reproduce bundle "
                "RUN` writes one); this one has files before it. Refused, nothing extracted."
            )
        envelope = read_envelope(root / ENVELOPE_FILE)
        if self.key is None and PUB_FILE not in self.written:
            raise BadInput(
                f"{self.bundle} holds no {PUB_FILE} before its files: pass the signer's public "
                "key with --key."
            )
        public = load_public_key(self.key if self.key is not None else root / PUB_FILE)
        stmt = open_envelope(envelope, public, root / ENVELOPE_FILE)
        sizes: dict[str, int] = {}
        for subject in stmt["subject"]:
            size = attested_size(subject)
            if size is None:
                raise BadInput(
                    f"{self.bundle}: its statement records no size for {subject['name']} (an "
                    "older attestation): verify the directory itself, or attest it again."
                )
            sizes[subject["name"]] = size
        total = sum(sizes.values())
        if total > BUNDLE_MAX_BYTES:
            raise BadInput(
                f"{self.bundle}: its statement names {total} bytes, more than a bundle may "
                f"unpack to ({BUNDLE_MAX_BYTES}); refused."
            )
        self.sizes = sizes
        self.budget += total + _PER_ENTRY * (len(sizes) + 2)

    def _write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rest: str) -> None:
        dest = Path(self.into, self.top or "run", *PurePosixPath(rest).parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        src = tar.extractfile(member)
        if src is None:
            raise BadInput(f"{self.bundle}: entry {member.name!r} has no data.")
        with src, open(dest, "xb") as fh:
            shutil.copyfileobj(src, fh)
        self.written.add(rest)


def extract_bundle(bundle: Path, into: Path, key: Path | None = None) -> Path:
    """Unpack a bundle into `into` (a fresh temporary directory) as its signature allows
    (`_Unpack`); the attested directory inside it. BadInput for anything that is not a bundle
    this module writes, CheckFailed when its signature or an entry's size does not hold."""
    try:
        return _Unpack(Path(bundle), Path(into), key).run()
    except (tarfile.TarError, EOFError, OSError) as err:
        if isinstance(err, FileExistsError):
            raise BadInput(f"{bundle}: an entry appears twice ({err.filename}).") from None
        raise BadInput(f"{bundle} is not a readable bundle (a .tar.gz): {err}.") from None
