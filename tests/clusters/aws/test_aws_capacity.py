"""Capacity Blocks (moto lacks them): botocore's Stubber asserts the exact requests and feeds answers."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber
from support.aws import load, seed_recipe, set_fake_env

from launcher.clusters.aws.capacity import buy, list_offerings
from launcher.errors import BadInput

pytestmark = pytest.mark.aws

START = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
END = datetime(2026, 12, 4, 11, 30, tzinfo=UTC)
OFFERS = {
    "CapacityBlockOfferings": [
        {
            "CapacityBlockOfferingId": "cb-0cheap000000000a",
            "InstanceType": "p5en.48xlarge",
            "AvailabilityZone": "us-east-1a",
            "InstanceCount": 1,
            "StartDate": START,
            "EndDate": END,
            "CapacityBlockDurationHours": 24,
            "UpfrontFee": "745.20",
            "CurrencyCode": "USD",
        },
        {
            "CapacityBlockOfferingId": "cb-0dear0000000000b",
            "InstanceType": "p5en.48xlarge",
            "AvailabilityZone": "us-east-1b",
            "InstanceCount": 1,
            "StartDate": START,
            "EndDate": END,
            "CapacityBlockDurationHours": 24,
            "UpfrontFee": "912.00",
            "CurrencyCode": "USD",
        },
    ]
}
EXPECTED_LIST = {"InstanceType": "p5en.48xlarge", "InstanceCount": 1, "CapacityDurationHours": 24}


class StubSession:
    """A real boto3 session whose ec2 client is one stubbed client (no request leaves the process)."""

    def __init__(self) -> None:
        self.real = boto3.Session(region_name="us-east-1")
        self.region_name = "us-east-1"
        self.ec2 = self.real.client("ec2", region_name="us-east-1")
        self.stub = Stubber(self.ec2)

    def get_credentials(self):
        return self.real.get_credentials()

    def get_available_partitions(self):
        return self.real.get_available_partitions()

    def get_available_regions(self, *a, **kw):
        return self.real.get_available_regions(*a, **kw)

    def client(self, name, **kw):
        assert name == "ec2"
        return self.ec2


@pytest.fixture
def stubbed(monkeypatch):
    set_fake_env(monkeypatch)
    session = StubSession()
    with session.stub:
        yield session
        session.stub.assert_no_pending_responses()


def test_offerings_are_listed_cheapest_first_with_price_and_start(stubbed, tmp_path):
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    offers = list_offerings(seed_recipe(), load(tmp_path), hours=24, session=stubbed)
    assert [o.id for o in offers] == ["cb-0cheap000000000a", "cb-0dear0000000000b"]
    line = offers[0].line()
    assert "745.20 USD" in line and "2026-12-03 11:30" in line and "$31.05/instance-hour" in line


def test_buying_prints_the_price_first_and_sends_the_exact_purchase(stubbed, tmp_path):
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    stubbed.stub.add_response(
        "purchase_capacity_block",
        {"CapacityReservation": {"CapacityReservationId": "cr-0123456789abcdef0"}},
        {
            "CapacityBlockOfferingId": "cb-0cheap000000000a",
            "InstancePlatform": "Linux/UNIX",
            "TagSpecifications": [
                {
                    "ResourceType": "capacity-reservation",
                    "Tags": [
                        {
                            "Key": "reproduce:recipe",
                            "Value": seed_recipe().slug,
                        }
                    ],
                }
            ],
        },
    )
    printed: list[str] = []
    got = buy(
        seed_recipe(),
        load(tmp_path),
        "cb-0cheap000000000a",
        session=stubbed,
        log=printed.append,
        yes=True,  # consent: --yes (see the consent tests below)
    )
    assert got == "cr-0123456789abcdef0"
    assert "745.20 USD" in printed[0] and "cannot be cancelled" in printed[0]
    assert "reservation_id: cr-0123456789abcdef0" in printed[-1]


def test_an_offering_over_max_usd_is_not_bought(stubbed, tmp_path):
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    with pytest.raises(BadInput, match="more than --max-usd 800"):
        buy(
            seed_recipe(),
            load(tmp_path),
            "cb-0dear0000000000b",
            max_usd=800,
            session=stubbed,
            log=lambda m: None,
        )
    # no purchase response was queued: a purchase call would have failed the Stubber


def test_an_unlisted_offering_is_not_bought(stubbed, tmp_path):
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    with pytest.raises(BadInput, match="not among the current offerings"):
        buy(
            seed_recipe(),
            load(tmp_path),
            "cb-0gone0000000000c",
            session=stubbed,
            log=lambda m: None,
            yes=True,
        )


def test_blocks_last_whole_days(tmp_path):
    with pytest.raises(BadInput, match="whole days"):
        list_offerings(seed_recipe(), load(tmp_path), hours=5)


def test_check_sends_the_launch_with_dry_run_and_creates_nothing(aws, ami, tmp_path):
    from support.aws import live_resources

    from launcher.clusters.aws.cluster import check

    lines = check(
        seed_recipe(),
        load(tmp_path),
        "c1",
        session=aws,
        ami_resolver=lambda n: ami,
        log=lambda m: None,
    )
    dry = [name for name, params in aws.calls.log if params.get("DryRun")]
    assert dry == ["create_security_group", "create_key_pair", "run_instances", "allocate_address"]
    run = [p for n, p in aws.calls.log if n == "run_instances"][0]
    assert len(run["NetworkInterfaces"]) == 16 and "KeyName" not in run
    assert any("RunInstances" in line for line in lines)
    ec2 = aws._real.client("ec2")
    assert live_resources(ec2) == {
        "instances": [],
        "addresses": [],
        "security_groups": [],
        "key_pairs": [],
    }


def test_nothing_reads_as_buying_before_the_max_usd_refusal(stubbed, tmp_path):
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    printed: list[str] = []
    with pytest.raises(BadInput, match="nothing was bought"):
        buy(
            seed_recipe(),
            load(tmp_path),
            "cb-0dear0000000000b",
            max_usd=800,
            session=stubbed,
            log=printed.append,
        )
    assert printed and "912.00 USD" in printed[0]  # the price was shown...
    assert not any("buying" in line.lower() for line in printed)  # ...and nothing said "buying"


def test_the_purchase_is_sent_only_after_the_price_was_shown_and_accepted(stubbed, tmp_path):
    events: list[str] = []
    stubbed.ec2.meta.events.register(
        "before-parameter-build.ec2.PurchaseCapacityBlock",
        lambda **kw: events.append("purchase sent"),
    )
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    stubbed.stub.add_response(
        "purchase_capacity_block",
        {"CapacityReservation": {"CapacityReservationId": "cr-0123456789abcdef0"}},
    )
    buy(
        seed_recipe(),
        load(tmp_path),
        "cb-0cheap000000000a",
        max_usd=800,
        session=stubbed,
        log=events.append,
    )
    sent = events.index("purchase sent")
    assert "745.20 USD" in events[0] and events[0].startswith("offering")
    assert any(line.startswith("buying") for line in events[1:sent])


@pytest.mark.parametrize("limit", [float("nan"), float("inf"), 0.0])
def test_a_max_usd_that_cannot_refuse_anything_is_refused(stubbed, tmp_path, limit):
    with pytest.raises(BadInput, match="--max-usd"):
        buy(seed_recipe(), load(tmp_path), "cb-0cheap000000000a", max_usd=limit, session=stubbed)


# --- consent: a purchase needs what a launch needs (issue 19) --------------------------------------

PURCHASE = {"CapacityReservation": {"CapacityReservationId": "cr-0123456789abcdef0"}}


def test_without_a_terminal_yes_or_budget_nothing_is_asked_of_aws(stubbed, tmp_path):
    # nothing queued on the Stubber: any AWS call (even the listing) would fail the test
    with pytest.raises(BadInput, match="cannot be cancelled") as info:
        buy(seed_recipe(), load(tmp_path), "cb-0cheap000000000a", session=stubbed)
    assert (
        info.value.exit_code == 2 and "--yes" in str(info.value) and "--max-usd" in str(info.value)
    )


@pytest.mark.parametrize("answer, bought", [(True, True), (False, False)])
def test_at_a_terminal_the_question_comes_after_the_price(stubbed, tmp_path, answer, bought):
    from launcher.cost.costgate import NotConfirmed

    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    if bought:
        stubbed.stub.add_response("purchase_capacity_block", PURCHASE)
    events: list[str] = []

    def confirm(question: str) -> bool:
        events.append(f"asked: {question}")
        return answer

    kwargs = {"session": stubbed, "log": events.append, "confirm": confirm}
    if bought:
        assert buy(seed_recipe(), load(tmp_path), "cb-0cheap000000000a", **kwargs).startswith("cr-")
    else:
        with pytest.raises(NotConfirmed, match="not bought"):
            buy(seed_recipe(), load(tmp_path), "cb-0cheap000000000a", **kwargs)
    asked = next(i for i, e in enumerate(events) if e.startswith("asked:"))
    assert "745.20 USD" in events[0] and asked > 0 and "cannot be cancelled" in events[asked]
    assert any(e.startswith("buying") for e in events) is bought


def test_a_terminal_is_asked_even_with_a_budget_and_yes_answers_for_it(stubbed, tmp_path):
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    with pytest.raises(BadInput, match="not bought"):
        buy(
            seed_recipe(),
            load(tmp_path),
            "cb-0cheap000000000a",
            max_usd=800,
            session=stubbed,
            confirm=lambda q: False,
        )
    stubbed.stub.add_response("describe_capacity_block_offerings", OFFERS, EXPECTED_LIST)
    stubbed.stub.add_response("purchase_capacity_block", PURCHASE)
    asked: list[str] = []
    got = buy(
        seed_recipe(),
        load(tmp_path),
        "cb-0cheap000000000a",
        session=stubbed,
        yes=True,
        confirm=lambda q: asked.append(q) or False,
    )
    assert got.startswith("cr-") and asked == []


def test_the_capacity_command_without_a_terminal_refuses_with_exit_2(tmp_path, monkeypatch):
    import subprocess
    import sys

    from support.aws import REPO, fake_env

    env = {**fake_env(), "PATH": "/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED": "true"}
    env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # nothing listens: a call would fail, not leak
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "capacity", str(REPO / "recipes/qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k.yaml"),
         "--cluster", "aws", "--buy", "cb-0cheap000000000a"],
        capture_output=True, text=True, cwd=REPO, env=env, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "nothing was bought" in proc.stderr and "Traceback" not in proc.stderr
    assert "buying" not in proc.stderr
