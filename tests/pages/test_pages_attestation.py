"""report.html says whether the run is attested, by which key (OpenSSH fingerprint), and whether
`verify` passed: after `reproduce attest` it did; a page rendered later says it did not check, and
names the command that does; a run never attested says so."""

from __future__ import annotations

import json
import re
import subprocess

from support.attest import cli, keypair
from support.pages import make_run

from launcher.pages import write_run_page


def _line(page: str) -> str:
    found = re.search(r'<p class="meta" data-attested="[^"]*"[^>]*>.*?</p>', page)
    assert found, "no attestation line on the page"
    return found.group(0)


def test_the_page_shows_the_signer_and_that_verify_passed(tmp_path):
    rd = make_run(tmp_path)
    before = _line((rd / "report.html").read_text())  # the page measure wrote
    assert 'data-attested="no"' in before and "reproduce attest RUN" in before
    key, pub = keypair(tmp_path)
    assert cli("attest", rd, "--key", key).returncode == 0
    line = _line((rd / "report.html").read_text())
    openssh = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert 'data-attested="yes"' in line and 'data-verify="passed"' in line
    assert f'data-fingerprint="{openssh}"' in line and "verify passed" in line
    # rendered again later (no check made then): says so, and how to check
    write_run_page(rd)
    later = _line((rd / "report.html").read_text())
    assert 'data-verify="not-checked"' in later and f"reproduce verify {rd}" in later
    assert cli("verify", rd, "--key", pub).returncode == 0  # the page is not evidence


def test_a_run_never_attested_says_so_and_a_broken_envelope_is_shown_broken(tmp_path):
    rd = make_run(tmp_path)
    write_run_page(rd)
    assert 'data-attested="no"' in _line((rd / "report.html").read_text())
    (rd / "attestation.intoto.json").write_text(json.dumps({"payload": "!!"}))
    write_run_page(rd)
    line = _line((rd / "report.html").read_text())
    assert 'data-attested="broken"' in line and "cannot be read" in line
