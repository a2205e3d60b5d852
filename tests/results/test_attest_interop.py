"""Standard tools accept what `reproduce attest` writes, and `verify` accepts what they sign.

- securesystemslib's DSSE (the in-toto project's envelope library) verifies our envelope, and an
  envelope it signs over our statement passes `reproduce verify`;
- in-toto's own verifier (`in_toto.models.metadata.Metadata.load` + `verify_signature`) accepts
  the envelope file as is;
- in-toto-attestation's binding parses the payload with the Statement v1 protobuf definition and
  validates it.

cosign is not packaged for Debian 12 nor on PyPI (the registries this project installs from), so
it is not run here (docs/attestation.md says how it would be).
"""

from __future__ import annotations

import base64
import json
import shutil

import pytest
from support.attest import cli, keypair, measured_out

from launcher.results.attest import ENVELOPE_FILE
from launcher.results.attest_keys import load_public_key, load_signing_key


@pytest.fixture(scope="module")
def attested(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    key, pub = keypair(root)
    out = measured_out(root)
    assert cli("attest", out, "--key", key).returncode == 0
    return out, key, pub


def _sslib_key(pub_path):
    from securesystemslib.signer import SSlibKey

    from launcher.results.attest_keys import fingerprint

    public = load_public_key(pub_path)
    return SSlibKey.from_crypto(public, keyid=fingerprint(public), scheme="ed25519")


def test_securesystemslib_dsse_verifies_our_envelope(attested):
    from securesystemslib.dsse import Envelope

    out, _, pub = attested
    envelope = Envelope.from_dict(json.loads((out / ENVELOPE_FILE).read_text()))
    key = _sslib_key(pub)
    assert list(envelope.verify([key], 1)) == [key.keyid]
    assert envelope.payload_type == "application/vnd.in-toto+json"


def test_in_toto_verifier_accepts_the_envelope_file(attested):
    from in_toto.models.metadata import Envelope, Metadata

    out, _, pub = attested
    metadata = Metadata.load(str(out / ENVELOPE_FILE))
    assert isinstance(metadata, Envelope)
    key = _sslib_key(pub)
    metadata.verify_signature({"keyid": key.keyid, **key.to_dict()})  # raises when it fails
    other = _sslib_key(keypair(out.parent, "other")[1])
    from in_toto.exceptions import SignatureVerificationError

    with pytest.raises(SignatureVerificationError):
        metadata.verify_signature({**other.to_dict(), "keyid": key.keyid})


def test_in_toto_attestation_binding_parses_and_validates_the_statement(attested):
    import google.protobuf.json_format as pb_json
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    out, _, _ = attested
    payload = base64.b64decode(json.loads((out / ENVELOPE_FILE).read_text())["payload"])
    pb = pb_json.Parse(payload, statement_pb2.Statement())  # unknown top-level fields refused
    Statement.copy_from_pb(pb).validate()
    assert pb.predicate_type == "https://reproduce.dev/attestation/run/v1"
    assert {s.name for s in pb.subject} >= {"result.yaml", "verdict.json", "inputs/train.log"}


def test_an_envelope_signed_by_securesystemslib_passes_reproduce_verify(attested, tmp_path):
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    out, key, pub = attested
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    ours = json.loads((d / ENVELOPE_FILE).read_text())
    theirs = Envelope(base64.b64decode(ours["payload"]), ours["payloadType"], {})
    theirs.sign(CryptoSigner(load_signing_key(key), _sslib_key(pub)))
    (d / ENVELOPE_FILE).write_text(json.dumps(theirs.to_dict()))
    proc = cli("verify", d, "--key", pub)
    assert proc.returncode == 0, proc.stderr
