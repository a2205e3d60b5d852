"""Live prices: the run's price is looked up from AWS, with the catalog as the offline fallback.

botocore's Stubber stands in for AWS (moto has no Price List API, and its spot history and
Capacity Blocks are not AWS's): each lookup's request must equal the one the launcher prints and
be valid for the service model (the Stubber validates parameters against it), and each answer
has AWS's shape (a GetProducts PriceList item is a JSON document in a string). A failed lookup
(a refused permission, an answer that cannot be read) falls back to the catalog's price with a
warning and never stops a run. The last test runs the real CLI against an endpoint on loopback
that answers the Price List like AWS and refuses everything else: the price it answered is the
run's, recorded before anything is launched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.stub import Stubber
from support.aws import load, seed_recipe, set_fake_env
from support.operator_cli import ERROR_XML, SEED, aws_env, run_piped

from launcher import catalog
from launcher.clusters.aws.prices import live_price, pricing_region, request
from launcher.records.runs import summarize

pytestmark = pytest.mark.aws
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def product(itype: str, region: str, usd: str, sku: str = "8ZN3YSPRRXJ6B7XK") -> str:
    """One PriceList item as GetProducts returns it: an aws_v1 product document, as a string."""
    term, rate = f"{sku}.JRTCKXETXF", f"{sku}.JRTCKXETXF.6YS6EN2CT7"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": itype,
                    "regionCode": region,
                    "location": "US East (N. Virginia)",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                    "licenseModel": "No License required",
                    "usagetype": f"BoxUsage:{itype}",
                    "operation": "RunInstances",
                    "vcpu": "192",
                    "servicecode": "AmazonEC2",
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    term: {
                        "priceDimensions": {
                            rate: {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {itype} Instance Hour",
                                "appliesTo": [],
                                "rateCode": rate,
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2025-06-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                }
            },
            "version": "20251101000000",
            "publicationDate": "2025-11-01T00:00:00Z",
        }
    )


class StubSession:
    """A real boto3 session whose clients are stubbed (nothing leaves the process); it keeps the
    region each client was made for (the Price List has two endpoints only)."""

    def __init__(self, region: str = "us-east-1") -> None:
        self.real = boto3.Session(region_name=region)
        self.region_name = region
        self.stubs: dict[str, Stubber] = {}
        self.clients: dict[str, object] = {}
        self.made_in: dict[str, str] = {}

    def stub(self, service: str, region: str | None = None) -> Stubber:
        if service not in self.stubs:
            client = self.real.client(service, region_name=region or self.region_name)
            self.clients[service] = client
            self.stubs[service] = Stubber(client)
            self.stubs[service].activate()
        return self.stubs[service]

    def get_credentials(self):
        return self.real.get_credentials()

    def get_available_partitions(self):
        return self.real.get_available_partitions()

    def get_available_regions(self, *a, **kw):
        return self.real.get_available_regions(*a, **kw)

    def client(self, name, region_name=None, **kw):
        self.made_in[name] = region_name
        return self.clients[name]


@pytest.fixture
def session(monkeypatch):
    set_fake_env(monkeypatch)
    made = StubSession()
    yield made
    for stub in made.stubs.values():
        stub.assert_no_pending_responses()
        stub.deactivate()


def _price(session, tmp_path, fallback=None, **fields):
    profile = load(tmp_path, **fields)
    return live_price(seed_recipe(), profile, fallback, session=session, now=NOW)


def test_on_demand_comes_from_the_price_list_with_the_filters_aws_documents(session, tmp_path):
    call = request("p5en.48xlarge", "us-east-1", "on-demand", 1, NOW)
    assert {f["Field"]: f["Value"] for f in call.params["Filters"]} == {
        "instanceType": "p5en.48xlarge",
        "regionCode": "us-east-1",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
    }
    answer = {
        "FormatVersion": "aws_v1",
        "PriceList": [product("p5en.48xlarge", "us-east-1", "61.5")],
    }
    session.stub("pricing").add_response("get_products", answer, call.params)
    price, why = _price(session, tmp_path, catalog.price_per_hour("p5en.48xlarge", "us-east-1"))
    assert why is None and price is not None
    assert price.value == 61.5 and price.source == "price-list-api"
    assert price.region == "us-east-1" and price.read_at == "2026-12-01T10:00:00Z"
    assert price.fallback is None and "GetProducts" in price.describe()
    assert session.made_in["pricing"] == "us-east-1"


@pytest.mark.parametrize(
    "region, endpoint", [("eu-north-1", "us-east-1"), ("ap-northeast-1", "ap-south-1")]
)
def test_the_price_list_is_asked_at_one_of_its_two_endpoints(
    monkeypatch, tmp_path, region, endpoint
):
    set_fake_env(monkeypatch)
    session = StubSession(region)
    call = request("p5en.48xlarge", region, "on-demand", 1, NOW)
    answer = {"FormatVersion": "aws_v1", "PriceList": [product("p5en.48xlarge", region, "79.12")]}
    session.stub("pricing", endpoint).add_response("get_products", answer, call.params)
    price, why = _price(session, tmp_path, region=region)
    assert why is None and price.value == 79.12 and price.region == region
    assert pricing_region(region) == endpoint == session.made_in["pricing"]
    session.stubs["pricing"].assert_no_pending_responses()


def test_spot_is_the_highest_zone_of_the_latest_spot_prices(session, tmp_path):
    call = request("p5en.48xlarge", "us-east-1", "spot", 1, NOW)
    row = {"InstanceType": "p5en.48xlarge", "ProductDescription": "Linux/UNIX"}
    history = {
        "SpotPriceHistory": [
            {**row, "AvailabilityZone": "us-east-1a", "SpotPrice": "31.5000", "Timestamp": NOW},
            {**row, "AvailabilityZone": "us-east-1a", "SpotPrice": "99.0000",  # an old price
             "Timestamp": datetime(2026, 11, 30, tzinfo=UTC)},
            {**row, "AvailabilityZone": "us-east-1b", "SpotPrice": "27.1988", "Timestamp": NOW},
        ]
    }  # fmt: skip
    session.stub("ec2").add_response("describe_spot_price_history", history, call.params)
    price, why = _price(session, tmp_path, capacity={"type": "spot"})
    assert why is None and price.value == 31.5 and price.source == "spot-history"
    assert "us-east-1a $31.5" in price.detail and "us-east-1b $27.1988" in price.detail


def test_a_capacity_block_is_priced_from_the_cheapest_offerings_fee(session, tmp_path):
    call = request("p5en.48xlarge", "us-east-1", "capacity-block", 1, NOW)
    assert call.params == {
        "InstanceType": "p5en.48xlarge",
        "InstanceCount": 1,
        "CapacityDurationHours": 24,
    }
    offer = {
        "InstanceType": "p5en.48xlarge",
        "AvailabilityZone": "us-east-1a",
        "InstanceCount": 1,
        "StartDate": NOW,
        "EndDate": NOW,
        "CapacityBlockDurationHours": 24,
        "CurrencyCode": "USD",
    }
    offers = {
        "CapacityBlockOfferings": [
            {**offer, "CapacityBlockOfferingId": "cb-0dear0000000000b", "UpfrontFee": "912.00"},
            {**offer, "CapacityBlockOfferingId": "cb-0cheap000000000a", "UpfrontFee": "745.20"},
        ]
    }
    session.stub("ec2").add_response("describe_capacity_block_offerings", offers, call.params)
    fields = {"capacity": {"type": "capacity-block", "reservation_id": "cr-0123456789abcdef0"}}
    price, why = _price(session, tmp_path, **fields)
    assert why is None and price.source == "capacity-block"
    assert price.value == pytest.approx(745.20 / 24) and "cb-0cheap000000000a" in price.detail


@pytest.mark.parametrize(
    "answer, words",
    [
        ({"error": "AccessDeniedException"}, "AccessDeniedException"),
        ({"error": "ThrottlingException"}, "ThrottlingException"),
        ({"FormatVersion": "aws_v1", "PriceList": []}, "lists no on-demand"),
        ({"FormatVersion": "aws_v1", "PriceList": ["{not json"]}, "not AWS's product document"),
        ({"FormatVersion": "aws_v1", "PriceList": ['{"product": 1}']}, "not AWS's product"),
        (
            {
                "FormatVersion": "aws_v1",
                "PriceList": [
                    product("p5en.48xlarge", "us-east-1", "63.296"),
                    product("p5en.48xlarge", "us-east-1", "12.0", sku="OTHERSKU00000000"),
                ],
            },
            "2 different prices",
        ),
        (
            {"FormatVersion": "aws_v1", "PriceList": [product("p5en.48xlarge", "us-east-1", "0")]},
            "lists no on-demand",
        ),
        (
            {
                "FormatVersion": "aws_v1",
                "PriceList": [product("p5.48xlarge", "us-east-1", "55.04")],
            },
            "lists no on-demand",  # another type's price is no answer
        ),
    ],
    ids=["denied", "throttled", "empty", "not-json", "not-a-product", "ambiguous", "zero", "other"],
)
def test_a_failed_lookup_falls_back_to_the_catalog_with_a_warning(session, tmp_path, answer, words):
    call = request("p5en.48xlarge", "us-east-1", "on-demand", 1, NOW)
    stub = session.stub("pricing")
    if "error" in answer:
        stub.add_client_error(
            "get_products", answer["error"], "no", 400, expected_params=call.params
        )
    else:
        stub.add_response("get_products", answer, call.params)
    fallback = catalog.price_per_hour("p5en.48xlarge", "us-east-1")
    price, why = _price(session, tmp_path, fallback)
    assert why is not None and words in why and "$63.296/h is used" in why
    assert price is not None and price.value == 63.296 and price.source == "catalog"
    assert price.fallback == why and "live price lookup failed" in price.describe()


def test_without_a_catalog_price_a_failed_lookup_leaves_no_price_and_says_so(session, tmp_path):
    session.stub("pricing").add_client_error("get_products", "AccessDeniedException", "no", 400)
    price, why = _price(session, tmp_path, None)
    assert price is None and "no price is known" in why


def test_every_printed_request_is_valid_for_its_service_model():
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    core = get_session()
    for ctype in ("on-demand", "reservation", "spot", "capacity-block"):
        call = request("p5.48xlarge", "us-west-2", ctype, 4, NOW)
        model = core.get_service_model(call.service).operation_model(call.operation)
        report = ParamValidator().validate(call.params, model.input_shape)
        assert not report.has_errors(), (ctype, report.generate_report())


def test_importing_the_price_lookup_imports_no_boto3():
    code = (
        "import sys, launcher.clusters.aws.prices, launcher.clusters.aws.quota; "
        "bad = [m for m in ('boto3', 'botocore') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class PriceListEndpoint:
    """Where AWS would be (AWS_ENDPOINT_URL): GetProducts answered like AWS, all else refused."""

    def __init__(self, usd: str) -> None:
        self.targets: list[str] = []
        seen, body = (
            self.targets,
            json.dumps(
                {
                    "FormatVersion": "aws_v1",
                    "PriceList": [product("p5en.48xlarge", "us-east-1", usd)],
                }
            ).encode(),
        )

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target") or self.path
                seen.append(target)
                pricing = target == "AWSPriceListService.GetProducts"
                answer = body if pricing else ERROR_XML
                self.send_response(200 if pricing else 403)
                self.send_header(
                    "Content-Type", "application/x-amz-json-1.1" if pricing else "text/xml"
                )
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_a_real_run_records_the_looked_up_price_before_anything_is_launched(tmp_path):
    endpoint = PriceListEndpoint("58.1234")
    try:
        runs = tmp_path / "runs"
        result = run_piped(
            [str(SEED), "--cluster", "aws", "--runs-dir", str(runs), "--yes"],
            aws_env(endpoint, tmp_path),
        )
    finally:
        endpoint.server.shutdown()
        endpoint.server.server_close()
    assert endpoint.targets[0] == "AWSPriceListService.GetProducts", endpoint.targets
    assert result.returncode == 3, result.stderr  # the launch itself was refused: no EC2 here
    # the cost shown before the launch is the live one
    assert "x $58.1234/h" in result.stderr and "[price: price-list-api:" in result.stderr
    (run_json,) = list(runs.glob("**/run.json"))
    record = json.loads(run_json.read_text())
    assert record["price"]["usd_per_hour"] == 58.1234
    assert record["price"]["source"] == "price-list-api" and record["price"]["read_at"]
    assert record["cost"]["price_per_hour"] == 58.1234
    summary = summarize(run_json.parent)
    assert summary.price_per_hour == 58.1234 and "price-list-api" in summary.price_source
