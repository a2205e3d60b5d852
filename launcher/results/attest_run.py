"""Attest one directory: build the statement, check it, sign it, write it, show it on the page.

Why a module apart from the command: `reproduce attest` and `reproduce nightly --key` both
sign runs, and they must do it the one same way: nothing is signed whose figures are not what its
logs give (the same re-measure `verify` runs), and what was written is verified as a reader will
verify it before the page says "verify passed". docs/attestation.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: cryptography is not loaded at start-up
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def attest_directory(
    directory: Path, private_key: Ed25519PrivateKey, *, now: float | None = None
) -> dict[str, Any]:
    """Sign the directory's evidence: check that its figures are what its logs give, write
    attestation.intoto.json and attestation.pub, refresh report.html. Returns a summary."""
    from launcher.records.rundir import Files, _write_atomic
    from launcher.results.attest import (
        ENVELOPE_FILE,
        PUB_FILE,
        evidence_files,
        sign,
        statement,
        subjects_of,
    )
    from launcher.results.attest_keys import fingerprint, public_line
    from launcher.results.attest_predicate import INPUTS_DIR, build_predicate
    from launcher.results.attest_verify import check_subjects, remeasure_check, verify_dir

    inputs = directory / INPUTS_DIR
    had_inputs, written = inputs.exists(), False
    try:
        predicate = build_predicate(directory, now=now)  # may copy a bare log's inputs in
        stmt = statement(subjects_of(directory, evidence_files(directory)), predicate)
        check_subjects(directory, stmt)  # a file changing while we read it
        status, _ = remeasure_check(directory, stmt, files_first=True)  # CheckFailed: unsigned
        envelope = sign(stmt, private_key)
        public = private_key.public_key()
        written = True
        _write_atomic(
            directory / PUB_FILE, (public_line(public, "reproduce attest") + "\n").encode()
        )
        _write_atomic(directory / ENVELOPE_FILE, (json.dumps(envelope, indent=2) + "\n").encode())
        verify_dir(directory, None)  # what was written verifies, as a reader will check it
    except BaseException:
        # nothing half-done: no copied inputs, and no attestation that would not verify
        if not had_inputs and inputs.is_dir():
            shutil.rmtree(inputs, ignore_errors=True)
        if written:
            for name in (ENVELOPE_FILE, PUB_FILE):
                (directory / name).unlink(missing_ok=True)
        raise
    page = None
    if (directory / Files.RUN).is_file() or (directory / Files.REPORT_HTML).is_file():
        from launcher.pages import write_run_page

        page = write_run_page(directory, verified={"verified": True})
    return {
        "directory": str(directory),
        "attestation": str(directory / ENVELOPE_FILE),
        "signed_by": fingerprint(public),
        "subjects": len(stmt["subject"]),
        "verdict": status,
        "page": str(page) if page else None,
    }
