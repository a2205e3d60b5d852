"""A profile's host, connect_host and user become arguments of ssh (`reproduce ssh`, and the
jump through a head): none may start with `-` or hold a blank, at any place a profile can name
one (the profile's own fields and each `hosts` entry, written as text or as a mapping). The other
end of the same promise, the `--` before ssh's destination, is tested with the real ssh client in
tests/commands/test_operator_logs.py."""

from __future__ import annotations

import pytest
import yaml
from support.cli import SEED, reproduce_here

EVIL = ["-oProxyCommand=touch /tmp/x", "-F/dev/null", "a b", "host\nx", "--"]
PLACES = [
    ({"host": "{}"}, "host"),
    ({"host": "node", "connect_host": "{}"}, "connect_host"),
    ({"host": "node", "user": "{}"}, "user"),
    ({"hosts": ["{}"]}, "hosts[0]"),
    ({"hosts": ["a", {"host": "{}"}]}, "hosts[1].host"),
    ({"hosts": [{"host": "a", "user": "{}"}]}, "hosts[0].user"),
    ({"hosts": [{"host": "a", "connect_host": "{}"}]}, "hosts[0].connect_host"),
]


def fill(node, value):
    if node == "{}":
        return value
    if isinstance(node, dict):
        return {k: fill(v, value) for k, v in node.items()}
    if isinstance(node, list):
        return [fill(v, value) for v in node]
    return node


@pytest.mark.parametrize("fields, where", PLACES, ids=[w for _, w in PLACES])
@pytest.mark.parametrize("value", EVIL)
def test_a_name_that_ssh_would_read_as_an_option_is_refused(tmp_path, fields, where, value):
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"kind": "ssh", **fill(fields, value)}))
    res = reproduce_here(str(SEED), "--cluster", str(profile), "--dry-run")
    assert res.code == 2, res.out
    assert f"  - {where}: " in res.err and "Traceback" not in res.err, (
        res.err
    )  # named, whichever rule


@pytest.mark.parametrize("host", ["10.0.0.7", "node-1.cluster.internal", "::1", "fe80::1%eth0"])
def test_ordinary_names_still_load(tmp_path, host):
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"kind": "ssh", "host": host, "user": "ubuntu.x-1"}))
    res = reproduce_here(str(SEED), "--cluster", str(profile), "--dry-run")
    assert res.code == 0, res.err
