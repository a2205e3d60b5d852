"""An error never prints a secret back (found 2026-12-04): a Hugging Face token pasted where its
variable's NAME belongs was quoted whole in the refusal, and a Ray address carrying
user:password@ was printed in the dry run's heading and kept in node.sh. The token field refuses
without showing it; the address refuses credentials, and every schema message shows a URL's
credentials as ***."""

from __future__ import annotations

import yaml
from support.cli import SEED, reproduce_here

TOKEN = "hf_qWeRtYuIoPaSdFgHjKlZxCvBnMaSdF"


def profile(tmp_path, **fields) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(fields))
    return str(path)


def test_a_token_given_as_the_name_of_its_variable_is_refused_and_not_shown(tmp_path):
    res = reproduce_here(
        str(SEED), "--cluster", profile(tmp_path, kind="local", secrets={"hf_token_env": TOKEN}),
        "--dry-run",
    )  # fmt: skip
    assert res.code == 2 and "looks like a Hugging Face token" in res.err
    assert TOKEN not in res.err + res.out and TOKEN[3:] not in res.err


def test_credentials_in_a_ray_address_are_refused_and_not_shown(tmp_path):
    address = "http://admin:hunter2@head:8265"
    res = reproduce_here(
        str(SEED), "--cluster", profile(tmp_path, kind="ray", address=address), "--dry-run"
    )
    assert res.code == 2 and "  - address: " in res.err
    assert "hunter2" not in res.err + res.out and "admin:" not in res.err
    ok = reproduce_here(
        str(SEED), "--cluster", profile(tmp_path, kind="ray", address="http://head:8265/x"),
        "--dry-run",
    )  # fmt: skip
    assert ok.code == 0, ok.err
