"""`reproduce attest`, `verify`, `bundle` and `keygen`: signed evidence of a run
(docs/attestation.md). One module: the four share the key, the directory a run id names, and
verifying (a bundle is verified before it is packed).

Exit codes: 0 done (verify: everything holds); 1 verify found a difference, or attest found that
the directory's figures are not what its logs give (it signs nothing then); 2 bad input (no such
directory, no measurement in it, a key that cannot be read, a bundle that is not one).
cryptography and securesystemslib are imported by the bodies only: they stay out of the CLI's
start-up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from launcher.commands import options as o
from launcher.commands.options import output_file
from launcher.commands.output import fail
from launcher.errors import BadInput, ReproduceError
from launcher.excerpt import printable


def attest_cmd(
    run: str = typer.Argument(
        ..., help="A run directory, a run id, or a `measure --out` directory."
    ),
    key: o.Key = None,
    runs_dir: o.RunsDir = None,
    json_out: o.Json = False,
) -> None:
    """Sign what a run holds and showed (in-toto statement, DSSE envelope, ed25519): writes attestation.intoto.json into it; exit 1 when its figures are not what its logs give."""  # noqa: E501 - typer shows its line breaks

    try:
        code = run_attest(run, key, runs_dir, json_out)
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


def verify_cmd(
    target: Path = typer.Argument(
        ..., help="An attested directory, a run id, or a bundle (.tar.gz)."
    ),
    key: o.Key = None,
    json_out: o.Json = False,
) -> None:
    """Check an attestation offline: the signature, every file's sha256, then the figures and verdict measured again from the raw log; exit 0 all hold, 1 the first difference, 2 bad input."""  # noqa: E501 - typer shows its line breaks

    raise typer.Exit(run_verify(target, key, json_out))


def bundle_cmd(
    run: str = typer.Argument(..., help="An attested directory or run id."),
    out: o.Out = None,
    runs_dir: o.RunsDir = None,
) -> None:
    """Pack an attested run (after verifying it) and its files into one .tar.gz to share (--out, default: beside the directory, .attested.tar.gz); `verify` takes it as it is."""  # noqa: E501 - typer shows its line breaks

    try:
        code = run_bundle(run, out, runs_dir)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def keygen_cmd(
    path: Path = typer.Argument(
        ..., help="Where to write the private key (PATH.pub beside).", callback=output_file
    ),
) -> None:
    """Make an ed25519 key pair for attestations (OpenSSH format; never overwrites)."""
    try:
        code = run_keygen(path)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def _directory(ref: str, runs_root: Path | None) -> Path:
    """A directory given by path (a run directory or a `measure --out` one), or a run id."""
    from launcher.records.rundir import RunDir

    return RunDir.target(ref, runs_root)


def _signing_key(key: Path | None) -> tuple[Path, Any]:
    from launcher.results.attest_keys import KEY_ENV, default_key_path, load_signing_key

    path = key if key is not None else default_key_path()
    if path is None:
        raise BadInput(
            f"no signing key: pass --key KEY (an OpenSSH ed25519 private key), set {KEY_ENV}, "
            "or have ~/.ssh/id_ed25519.",
            hint="`reproduce keygen PATH` makes a key for the purpose.",
        )
    return path, load_signing_key(path)


def run_attest(ref: str, key: Path | None, runs_root: Path | None, json_out: bool) -> int:
    from launcher.clusters import trust

    directory = _directory(ref, runs_root)
    path, private_key = _signing_key(key)
    from launcher.results.attest_run import attest_directory

    summary = attest_directory(directory, private_key)
    if json_out:
        print(json.dumps({**summary, "key": str(path)}))
    else:
        pub = f"{path}.pub" if Path(f"{path}.pub").is_file() else "SIGNER.pub"
        print(
            f"attested {directory}: {summary['subjects']} files, verdict {summary['verdict']}, "
            f"signed by {summary['signed_by']} ({path})\n"
            f"  {summary['attestation']}\n"
            f"  check it: reproduce verify {directory} --key {pub}"
        )
        shown = trust.run_line(directory)  # what its cluster vouched for (clusters/trust.py)
        if shown is not None:
            print(f"  {shown}")
    return 0


def verify_target(target: Path, key: Path | None) -> dict[str, Any]:
    """Verify a directory or a bundle; the Verified summary as a dict (CheckFailed/BadInput
    otherwise). A bundle is unpacked into a temporary directory that is removed after."""
    import tempfile

    from launcher.results.attest import extract_bundle, is_bundle
    from launcher.results.attest_verify import verify_dir

    target = Path(target)
    if not target.exists():
        raise BadInput(f"{target} does not exist; expected an attested directory or a bundle.")
    if target.is_dir():
        return verify_dir(target, key).to_dict()
    if not is_bundle(target):
        raise BadInput(f"{target} is neither a directory nor a bundle (a .tar.gz from bundle).")
    with tempfile.TemporaryDirectory(prefix="reproduce-verify-") as tmp:
        inner = extract_bundle(target, Path(tmp), key)
        out = verify_dir(inner, key).to_dict()
    out["directory"] = f"{target} ({inner.name}/)"
    return out


def run_verify(target: Path, key: Path | None, json_out: bool) -> int:
    try:
        from launcher.records.rundir import RunDir

        out = verify_target(RunDir.target(target), key)
    except ReproduceError as err:
        if json_out:
            print(json.dumps({"verified": False, "error": str(err), "exit_code": err.exit_code}))
        print(printable(f"error: {err}", keep="\n"), file=sys.stderr)  # a stranger's words
        return err.exit_code
    if json_out:
        print(json.dumps(out))
        return 0
    who = out["signed_by"] + (
        " (the key given)"
        if out["key_given"]
        else " (the key found beside the attestation: pass --key to check who signed)"
    )
    print(
        printable(
            f"verified {out['directory']}: signed by {who}; {out['subjects']} files as attested; "
            f"re-measured from the log: verdict {out['verdict']}, "
            f"{out['figures'].get('tokens_per_s_per_gpu')} tokens/s/GPU, as attested "
            f"({out['seconds']:.2f} s)"
        )
    )
    if out["unverified"]:  # what the run's cluster vouched for itself (clusters/trust.py)
        print(printable(f"  {out['unverified']}"))
    if out["unattested"]:  # file names in a stranger's bundle
        shown = ", ".join(out["unattested"][:8]) + (" ..." if len(out["unattested"]) > 8 else "")
        print(printable(f"  not attested (ignored): {shown}"))
    return 0


def run_bundle(ref: str, out: Path | None, runs_root: Path | None) -> int:
    """Pack an attested directory, after verifying it, into one .tar.gz."""
    from launcher.results.attest import ENVELOPE_FILE, write_bundle
    from launcher.results.attest_verify import verify_dir

    directory = _directory(ref, runs_root)
    if not (directory / ENVELOPE_FILE).is_file():
        raise BadInput(f"{directory} is not attested: `reproduce attest {directory}` first.")
    verified = verify_dir(directory)  # never bundle what would not verify
    names = verified.names
    target = out if out is not None else directory.parent / f"{directory.name}.attested.tar.gz"
    path = write_bundle(directory, names, target)
    print(f"bundle {path}: the attestation and its {len(names)} files")
    print(f"  check it anywhere: reproduce verify {path} --key SIGNER.pub")
    return 0


def run_keygen(path: Path) -> int:
    from launcher.results.attest_keys import keygen

    pub, fp = keygen(path)
    print(f"wrote {path} (private, mode 0600) and {pub}\n  fingerprint {fp}")
    print(f"  sign: reproduce attest RUN --key {path}; share {pub} with those who verify")
    return 0
