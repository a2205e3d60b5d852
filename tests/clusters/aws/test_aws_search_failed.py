"""Teardown's search by tag failing is not "nothing more there" (docs/aws.md, "Teardown").

Behind what aws.json lists, teardown searches AWS by the launch's tags for what a crash may have
left out of it. When AWS answers that search with an error (a throttle, a 5xx), the search was
not made: what aws.json lists is still ended, but the run is never said to be gone; the release
reports what was not looked for and names `reproduce down`, which searches again.
"""

from __future__ import annotations

import pytest
from support.aws import NOTHING, client_error, cluster, ec2_of, live_resources, quiet_down

from launcher.errors import InfraError

pytestmark = pytest.mark.aws


def _fail_searches(code: str):
    def fault(params: dict):
        if any(f["Name"].startswith("tag:") for f in params.get("Filters", [])):
            return client_error(code, "injected", "Describe")
        return None

    return fault


@pytest.mark.parametrize("call", ["describe_instances", "describe_addresses"])
@pytest.mark.parametrize("code", ["RequestLimitExceeded", "InternalError"])
def test_a_failed_search_is_reported_and_down_searches_again(
    aws, ami, tmp_path, banner, call, code
):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    aws.faults[call] = _fail_searches(code)
    with pytest.raises(InfraError) as err:
        c.release()
    text = str(err.value) + "\n".join(c.logs)
    assert "search by tag failed" in text and code in text, text
    assert "everything this run created is gone" not in "\n".join(c.logs)
    ec2 = ec2_of(aws)
    assert node.meta["instance_id"] not in live_resources(ec2)["instances"]  # listed: ended
    del aws.faults[call]
    _, lines = quiet_down(tmp_path / "run", aws)  # searches again, and this time it is made
    said = "\n".join(lines)
    assert "search by tag failed" not in said and "nothing was ended there" in said, said
    assert live_resources(ec2) == NOTHING
