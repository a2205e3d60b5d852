"""The run page's attestation line: is the run signed, by which key, and did `verify` pass.

Why the page never verifies by itself: verifying re-measures the run
(launcher/results/attest_verify.py, which reads through launcher/results/evaluate.py, which writes
this page): the page module may not import it. `reproduce attest` verifies the directory and
hands the result to the page it rewrites; any later rendering reads the envelope as it is
(unchecked: its keyid and time) and says that it was not checked, with the command that checks
it. docs/attestation.md.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from launcher.pages.html import code, esc
from launcher.records import jsonread

ENVELOPE = "attestation.intoto.json"


def read_attestation(run_dir: Path) -> dict[str, Any] | None:
    """What the envelope says about itself (unverified), or None when the run is not attested."""
    path = Path(run_dir) / ENVELOPE
    if not path.is_file():
        return None
    try:  # bounded and typed (launcher/records/jsonread.py): the envelope is anyone's bytes
        envelope = jsonread.Fields(jsonread.load_file(path))
        payload = base64.b64decode(envelope.text("payload") or "", validate=True)
        stmt = jsonread.Fields(jsonread.loads(payload.decode("utf-8", errors="replace")))
        keyids = [s.word("keyid") for s in envelope.records("signatures") if s.word("keyid")]
        subjects = stmt.raw("subject")
        return {
            "signed_by": ", ".join(keyids) or None,
            "attested_at": stmt.obj("predicate").scalar("attested_at"),
            "subjects": len(subjects) if isinstance(subjects, list) else 0,
        }
    except (jsonread.NodeJSONError, ValueError) as err:  # binascii.Error is a ValueError
        return {"unreadable": f"{ENVELOPE} cannot be read ({str(err)[:200]})"}


def attestation_html(info: dict[str, Any] | None, run_dir: str) -> str:
    """One paragraph for the page's header. `info`: read_attestation's, plus `verified`
    (True/False) and `error` when `reproduce attest` or `verify` checked it just now."""
    command = code(f"reproduce verify {run_dir} --key SIGNER.pub")
    if info is None:
        return (
            '<p class="meta" data-attested="no" data-verify="none">'
            f"<span>not attested ({code('reproduce attest RUN')} signs it)</span></p>"
        )
    if info.get("unreadable"):
        return (
            '<p class="meta" data-attested="broken" data-verify="failed">'
            f'<span class="no">✗ {esc(info["unreadable"])}</span></p>'
        )
    fp = esc(info.get("signed_by") or "no key")
    when = f" on {esc(info['attested_at'])}" if info.get("attested_at") else ""
    head = f"attested: signed by {code(info.get('signed_by') or 'no key')}{when}"
    if info.get("verified") is True:
        state, mark = (
            "passed",
            f'<span class="ok">✓ verify passed: the signature, its {esc(info.get("subjects"))} '
            f"files and the figures measured again from the log</span>",
        )
    elif info.get("verified") is False:
        state, mark = "failed", f'<span class="no">✗ verify failed: {esc(info.get("error"))}</span>'
    else:
        state, mark = "not-checked", f"<span>not checked by this page: {command}</span>"
    return (
        f'<p class="meta" data-attested="yes" data-verify="{state}" data-fingerprint="{fp}">'
        f"<span>{head}</span> {mark}</p>"
    )
