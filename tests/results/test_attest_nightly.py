"""`reproduce nightly --key KEY` attests every run it measured; a key that cannot be read is
bad input before the first recipe runs (nothing is paid for)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.attest import keypair, real_run
from support.measure import SEED

from launcher.errors import BadInput
from launcher.results.attest_verify import verify_dir
from launcher.runner.nightly import RecipeRun, nightly


def test_nightly_attests_each_measured_run_and_says_which_was_not(tmp_path):
    key, pub = keypair(tmp_path)
    made: list[Path] = []

    def runner(recipe: Path, options, *, held=None) -> RecipeRun:
        if made:  # the second recipe never reached a node: nothing measured, nothing to sign
            return RecipeRun(recipe, 3, None, "the node never came up")
        run = real_run(Path(options.runs_dir), tmp_path / "node")
        made.append(run)
        return RecipeRun(recipe, 0, run, None)

    lines: list[str] = []
    result = nightly(
        [SEED, SEED],
        "local",
        runs_dir=tmp_path / "runs",
        history=tmp_path / "h.sqlite",
        runner=runner,
        echo=lines.append,
        attest_key=key,
    )
    assert result.exit_code == 3  # the second recipe's infra failure, as without attesting
    verified = verify_dir(made[0], pub)
    assert verified.status == "reproduced"
    said = [line for line in lines if "attested" in line]
    assert said[0].startswith("[nightly 1/2] attested:") and verified.fingerprint in said[0]
    assert said[1] == "[nightly 2/2] not attested: the run was not measured"


def test_a_bad_attest_key_stops_the_nightly_before_any_recipe(tmp_path):
    ran: list[Path] = []
    (tmp_path / "junk").write_text("not a key\n")
    with pytest.raises(BadInput, match="cannot be read"):
        nightly(
            [SEED],
            "local",
            runs_dir=tmp_path / "runs",
            history=tmp_path / "h.sqlite",
            runner=lambda recipe, options, held=None: ran.append(recipe),  # type: ignore[arg-type,return-value]
            attest_key=tmp_path / "junk",
        )
    assert ran == []
