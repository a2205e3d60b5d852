"""Each entry of an ssh profile's `hosts` is a node of its own: a host listed twice (as text or
as a mapping, by any spelling of the entry) is refused naming both places, before anything
starts. Two nodes on one machine would start two Ray nodes on one address and share its GPUs,
and the run would be judged as if it had them all."""

from __future__ import annotations

import pytest
import yaml
from support.cli import FOUR_NODES, reproduce_here


@pytest.mark.parametrize(
    "hosts, where",
    [
        (["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"], "hosts[1]"),
        (["10.0.0.1", "10.0.0.2", "10.0.0.3", {"host": "10.0.0.1", "port": 2222}], "hosts[3].host"),
        ([{"host": "n1"}, {"host": "n2", "connect_host": "127.0.0.1"}, "n3", "n2"], "hosts[3]"),
    ],
)
def test_a_host_listed_twice_is_refused(tmp_path, hosts, where):
    profile = tmp_path / "hosts.yaml"
    profile.write_text(yaml.safe_dump({"kind": "ssh", "hosts": hosts}))
    res = reproduce_here(str(FOUR_NODES), "--cluster", str(profile), "--dry-run")
    assert res.code == 2, res.out
    assert f"  - {where}: " in res.err and "again; expected one machine per node" in res.err


def test_four_different_hosts_still_load(tmp_path):
    profile = tmp_path / "hosts.yaml"
    hosts = ["127.0.0.1", {"host": "127.0.0.2", "connect_host": "127.0.0.1", "port": 2222}]
    profile.write_text(yaml.safe_dump({"kind": "ssh", "hosts": hosts + ["127.0.0.3", "::1"]}))
    res = reproduce_here(str(FOUR_NODES), "--cluster", str(profile), "--dry-run")
    assert res.code == 0, res.err
