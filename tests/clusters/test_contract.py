"""The backend contract (launcher/clusters/contract.py): what a kind can do is declared, not guessed.

Callers ask `isinstance(cluster, WithNodeHealth)`; nothing in launcher/ looks a hook up by name on
a cluster or a backend. These tests hold that for every module and class there is, so a backend or
a capability added later is covered unasked: an AST walk for `getattr`/`hasattr` dispatch, every
cluster and backend class's declared capabilities against the methods it has, and the nightly's
lent cluster against every combination of capabilities the cluster it lends may declare.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
from pathlib import Path

import pytest

import launcher
from launcher import clusters
from launcher.clusters.base import Node
from launcher.clusters.contract import (
    BACKEND_CAPABILITIES,
    CLUSTER_CAPABILITIES,
    Backend,
    WithAllocation,
    WithBudgetWatch,
    WithDownCommand,
    WithJobTimeLimit,
    WithLeftovers,
    WithLentNode,
    WithMultiNode,
    WithNodeAfterRun,
    WithNodeHealth,
    WithNodeShell,
    WithOwnedNodes,
    WithOwnExecution,
    WithSchedulerJob,
    WithStepShell,
)
from launcher.clusters.local import LocalCluster
from launcher.runner.held import HeldNode, LentCluster

LAUNCHER = Path(launcher.__file__).parent
CAPABILITIES = BACKEND_CAPABILITIES + CLUSTER_CAPABILITIES


def _methods(cap: type) -> frozenset[str]:
    return frozenset(cap.__abstractmethods__)  # type: ignore[attr-defined]


# Every name a backend or a cluster answers to: its required part and every capability's methods.
HOOKS = frozenset(
    {"acquire", "transport", "release", "to_record", "from_plan", "from_record", "BACKEND"}
).union(*(_methods(c) for c in CAPABILITIES))


def _dispatches(tree: ast.AST) -> list[tuple[int, str]]:
    """`getattr(x, "name", ...)` / `hasattr(x, "name")` where the name is a hook of the contract
    or x is a cluster or a backend by its name: a capability looked up instead of declared."""
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr"}
            and len(node.args) >= 2
        ):
            continue
        target = ast.unparse(node.args[0]).lower()
        name = node.args[1]
        hook = isinstance(name, ast.Constant) and name.value in HOOKS
        if hook or any(w in target for w in ("cluster", "backend", "module")):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_backend_hook_is_found_by_name_anywhere_in_launcher():
    bad = [
        f"{path.relative_to(LAUNCHER.parent)}:{line}: {text}"
        for path in sorted(LAUNCHER.rglob("*.py"))
        for line, text in _dispatches(ast.parse(path.read_text(), str(path)))
    ]
    assert not bad, "declare a capability (launcher/clusters/contract.py) instead:\n" + "\n".join(
        bad
    )


@pytest.mark.parametrize(
    "source",
    [
        'probe = getattr(self.cluster, "lost_nodes", None)',
        'getattr(backend(kind), "check_ready", None)',
        'hasattr(module, "from_record")',
        'make = getattr(thing, "watch_budget")',
        "getattr(self._cluster, name)",
    ],
)
def test_the_dispatch_walk_finds_a_lookup_by_name(source):
    """The walk can fail: each way the hooks were looked up before is found."""
    assert _dispatches(ast.parse(source))


def test_the_dispatch_walk_leaves_other_getattr_alone():
    assert not _dispatches(ast.parse('getattr(yaml, "CSafeLoader", yaml.SafeLoader)'))


def _launcher_classes() -> list[type]:
    """Every class defined in launcher/ (every module imported: importing loads no client)."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages([str(LAUNCHER)], "launcher."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


def _is_cluster(cls: type) -> bool:
    return all(callable(getattr(cls, m, None)) for m in ("acquire", "transport", "release"))


CLASSES = _launcher_classes()
CONTRACT_CLASSES = [c for c in CLASSES if issubclass(c, Backend) or _is_cluster(c)]


def test_every_kind_is_a_backend_of_its_own_kind():
    for kind in clusters.BACKENDS:
        found = clusters.backend(kind)
        assert isinstance(found, Backend) and found.kind == kind


def test_the_walk_sees_every_backend_and_cluster():
    names = {c.__name__ for c in CONTRACT_CLASSES}
    want = {"LocalCluster", "SSHCluster", "AwsCluster", "RayCluster", "SlurmCluster", "LentCluster"}
    want |= {type(clusters.backend(k)).__name__ for k in clusters.BACKENDS}
    assert want <= names


@pytest.mark.parametrize("cls", CONTRACT_CLASSES, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_declared_capabilities_are_exactly_the_implemented_ones(cls):
    """A capability declared is implemented (its methods concrete), and a method of a capability
    is never there undeclared: the runner would not see it."""
    for cap in CAPABILITIES:
        has = {m for m in _methods(cap) if getattr(cls, m, None) is not None}
        if issubclass(cls, cap):
            assert not (_methods(cap) & getattr(cls, "__abstractmethods__", frozenset())), (
                f"{cls.__name__} declares {cap.__name__} and leaves its methods abstract"
            )
        else:
            assert not has, f"{cls.__name__} has {sorted(has)} without declaring {cap.__name__}"


def test_a_capability_declared_without_its_method_cannot_be_made():
    class Careless(LocalCluster, WithNodeHealth):
        pass

    with pytest.raises(TypeError, match="lost_nodes"):
        Careless()


# The lent cluster is the run's; an allocation is the group's own (held.py), never passed on; a
# shell is asked of a recorded run's cluster (`reproduce ssh`: from_record), never of a lent one.
LENDABLE = [
    c
    for c in CLUSTER_CAPABILITIES
    if c not in (WithLentNode, WithAllocation, WithNodeShell, WithStepShell)
]


def _cluster_with(caps: tuple[type, ...]) -> LocalCluster:
    """A cluster declaring exactly `caps`, each method answering with its own name."""
    calls: list[str] = []
    body = {
        "calls": calls,
        "watch_budget": lambda self, budget, started: calls.append("watch_budget"),
        "lost_nodes": lambda self, *, now=False: calls.append(f"lost_nodes now={now}") or ["x"],
        "leftovers": lambda self: calls.append("leftovers") or ["i-1"],
        "down_command": lambda self: calls.append("down_command") or "reproduce down R",
        "execution": lambda self, node, place: calls.append("execution") or "EXEC",
        "node_after_run": lambda self: calls.append("node_after_run") or "ends in 10 min",
        "job_started_at": lambda self: calls.append("job_started_at") or 12.5,
        "job_failure": lambda self, *, now=False: calls.append("job_failure") or "NODE_FAIL",
        "job_ended_at": lambda self: calls.append("job_ended_at") or 99.5,
    }
    methods = set().union(*(_methods(c) for c in caps)) if caps else set()
    kept = {k: v for k, v in body.items() if k == "calls" or k in methods}
    return type("Inner", (LocalCluster, *caps), kept)()


@pytest.mark.parametrize(
    "caps",
    [c for r in range(len(LENDABLE) + 1) for c in itertools.combinations(LENDABLE, r)],
    ids=lambda caps: "+".join(c.__name__ for c in caps) or "none",
)
def test_a_lent_cluster_declares_and_passes_on_what_the_group_cluster_declares(caps):
    inner = _cluster_with(caps)
    held = HeldNode("aws x1 shape", recipes=2)
    lent = held.lend(lambda: inner, Path("/runs/first"))
    assert isinstance(lent, LentCluster) and isinstance(lent, WithLentNode)
    assert {c for c in LENDABLE if isinstance(lent, c)} == set(caps)
    for cap in caps:
        if cap is WithBudgetWatch:
            lent.watch_budget(None, 0.0)
        elif cap is WithNodeHealth:
            assert lent.lost_nodes(now=True) == ["x"]
        elif cap is WithLeftovers:
            assert lent.leftovers() == ["i-1"]
        elif cap is WithDownCommand:
            assert lent.down_command() == "reproduce down R"
        elif cap is WithNodeAfterRun:
            assert lent.node_after_run() == "ends in 10 min"
        elif cap is WithOwnExecution:
            assert lent.execution(Node("n", "h"), None) == "EXEC"
        elif cap is WithSchedulerJob:
            assert lent.job_started_at() == 12.5
            assert lent.job_failure(now=True) == "NODE_FAIL"
            assert lent.job_ended_at() == 99.5
        else:
            pytest.fail(f"no check for {cap.__name__}: add one here")
    assert len(inner.calls) == sum(len(_methods(c)) for c in caps)
    assert lent.to_record() == {"kind": "local"}
    assert lent.lent_from is None  # nothing acquired yet: this run acquires
    lent.acquire()
    assert lent.lent_from == Path("/runs/first")


# --- what the runner asks of a kind before anything starts --------------------------------------

# The kinds whose real runs span several nodes, whose budget becomes the job's own limit, and
# whose nodes the user owns (no list price): each is a capability its backend declares.
EXPECTED = {
    WithMultiNode: {"ssh", "ray", "aws", "slurm"},
    WithJobTimeLimit: {"slurm"},
    WithOwnedNodes: {"slurm"},
}


@pytest.mark.parametrize("cap", list(EXPECTED), ids=lambda c: c.__name__)
def test_each_kind_declares_what_the_runner_asks(cap):
    assert {k for k in clusters.BACKENDS if isinstance(clusters.backend(k), cap)} == EXPECTED[cap]
    assert clusters.multi_node_kinds() == sorted(EXPECTED[WithMultiNode])
    for kind in clusters.BACKENDS:
        assert clusters.multi_node(kind) == (kind in EXPECTED[WithMultiNode])
        assert clusters.owned_nodes(kind) == (kind in EXPECTED[WithOwnedNodes])


def _kind_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """`x.kind == "slurm"`, `kind in ("ssh", "aws")`, `p.kind != "aws"`: a kind asked by its
    name where a capability could be declared."""
    names = set(clusters.BACKENDS)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        asks_kind = any(
            (isinstance(s, ast.Attribute) and s.attr == "kind")
            or (isinstance(s, ast.Name) and s.id == "kind")
            for s in sides
        )
        literals = {
            c.value
            for s in sides
            for c in ast.walk(s)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        }
        if asks_kind and literals & names:
            found.append((node.lineno, ast.unparse(node)))
    return found


# The runner names no kind: the multi-node refusal, the job's time limit, the price of owned
# nodes, --instance-id, the launch requests, the dry run's sections and `reproduce ssh` ask the
# contract. A test of a kind's name added there is caught.
KIND_NAMED: dict[str, list[str]] = {}


def test_the_runner_asks_capabilities_not_kind_names():
    seen = {}
    for path in sorted((LAUNCHER / "runner").rglob("*.py")):
        found = _kind_tests(ast.parse(path.read_text(), str(path)))
        if found:
            seen[path.name] = sorted(text for _, text in found)
    want = {name: sorted(texts) for name, texts in KIND_NAMED.items()}
    assert seen == want, "declare a capability in launcher/clusters/contract.py instead"


@pytest.mark.parametrize(
    "source",
    [
        'if recipe.nodes > 1 and profile.kind not in ("ssh", "aws"):\n    pass',
        'if profile.kind == "slurm":\n    pass',
        'x = kind != "ray"',
    ],
)
def test_the_kind_walk_finds_a_kind_asked_by_name(source):
    assert _kind_tests(ast.parse(source))


def test_a_multi_node_recipe_is_refused_on_a_kind_without_the_capability(monkeypatch):
    """The runner's check before a start asks the contract: a backend that stops declaring
    WithMultiNode has a multi-node recipe refused (the dry run says so), naming the kinds that
    declare it."""
    from support.cli import FOUR_NODES

    from launcher.runner.prelaunch import RunOptions, check_before_start, prepare

    prepared = prepare(FOUR_NODES, RunOptions(cluster="aws"))
    assert check_before_start(prepared, RunOptions(cluster="aws")).refusals == ()

    class SingleNode(Backend):  # aws, declaring nothing beyond the required part
        kind = "aws"
        record_fields = clusters.backend("aws").record_fields

        def from_plan(self, plan, options, run_dir):
            raise AssertionError("nothing is launched")

        from_record = from_plan

    monkeypatch.setattr("launcher.clusters.aws.BACKEND", SingleNode())
    [why] = check_before_start(prepared, RunOptions(cluster="aws")).refusals
    assert "4 nodes" in why and "runs single-node recipes only" in why, why
    assert "on kind ray, slurm, ssh;" in why, why


def test_runs_with_clusters_of_their_own_share_one_allocation():
    """A cluster declaring WithAllocation (slurm: a step of the group's allocation): the group
    holds the allocation its first run makes, each run keeps its own cluster (made from its own
    plan), joins the allocation on acquire and ends only its own part on release; the
    allocation is acquired once and ended once, by the group."""
    events: list[str] = []

    class Hold(LocalCluster):
        def acquire(self):
            events.append("hold acquire")
            return [Node("job-node-0", "slurm-assigned")]

        def release(self):
            events.append("hold release")

    class Own(LocalCluster, WithAllocation):
        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag

        def allocation(self, recipes):
            events.append(f"allocation for {[p.name for p in recipes]} by {self.tag}")
            return Hold()

        def join(self, allocation, nodes):
            events.append(f"{self.tag} joins {type(allocation).__name__}")
            return nodes

        def release(self):
            events.append(f"{self.tag} release")

        def to_record(self):
            return {"kind": "local", "own": self.tag}

    held = HeldNode("slurm 8 GPUs x1", recipes=2, paths=[Path("a.yaml"), Path("b.yaml")])
    for tag in ("first", "second"):
        lent = held.lend(lambda tag=tag: Own(tag), Path(f"/runs/{tag}"))
        assert not isinstance(lent, WithAllocation)  # the group's own, never passed on
        assert lent.to_record() == {"kind": "local", "own": tag}  # the run's own record
        assert [n.name for n in lent.acquire()] == ["job-node-0"]
        lent.release()
    assert held.release() is None and held.release() is None
    assert events == [
        "allocation for ['a.yaml', 'b.yaml'] by first",
        "hold acquire",
        "first joins Hold",
        "first release",
        "second joins Hold",
        "second release",
        "hold release",
    ]
    assert held.holder == Path("/runs/first") and held.to_record()["held"] == {"kind": "local"}


@pytest.mark.parametrize("kind", sorted(clusters.BACKENDS))
def test_instance_id_is_taken_only_by_a_kind_that_launches(kind, tmp_path):
    """--instance-id asks the contract (`WithProvisioning`): a kind that launches nothing refuses
    it before anything starts (exit 2, naming its kind); one that launches runs on it."""
    from support.cli import REPO, SEED, reproduce

    from launcher.clusters.contract import WithProvisioning

    shipped = REPO / "env" / f"{kind}.yaml"
    if not shipped.is_file():
        pytest.fail(f"env/{kind}.yaml: every kind ships a profile")
    got = reproduce(
        str(SEED), "--cluster", str(shipped), "--instance-id", "i-0123456789abcdef0", "--dry-run"
    )
    if isinstance(clusters.declared(kind), WithProvisioning):
        assert got.code == 0, got.err
        assert "i-0123456789abcdef0" in got.out
    else:
        assert got.code == 2, got.out + got.err
        assert f"is of kind {kind}, which launches none" in got.err
        assert "Traceback" not in got.err
