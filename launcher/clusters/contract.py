"""The backend contract: what every cluster kind must do, and what it may declare it can do.

A kind is one `Backend` object (its module's `BACKEND`, found by the registry in
`launcher/clusters/__init__.py`), and a run's cluster is one `Cluster` (launcher/clusters/base.py).
Everything beyond the required part is an optional capability, declared by inheriting a `With...`
class below (the model: dstack's `ComputeWith...Support` mixins). Callers ask
`isinstance(cluster, WithNodeHealth)` and call the method the class names; they never look for an
attribute by name. A declared capability is a promise the class keeps: each `With...` class makes
its methods abstract, so a backend that declares one and lacks its method cannot be made, and
tests/clusters/test_contract.py fails for a method of a capability a class has without declaring
it, and for a `getattr(..., "hook", None)` dispatch anywhere in launcher/.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from launcher.clusters.base import Cluster, Node, Transport
from launcher.clusters.execution import Execution, Place, WrapperExecution

if TYPE_CHECKING:
    from datetime import datetime

    from launcher.catalog import Price
    from launcher.clusters.base import LaunchOptions
    from launcher.cost.budget import Budget
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe
    from launcher.plan.plan import Plan


@dataclass(frozen=True)
class RecordField:
    """One field of a kind's run.json `cluster` record: the JSON types it may hold, and whether
    a record may lack it (then the backend's default is the truth, never a guess)."""

    types: tuple[type, ...]
    optional: bool = False

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) and bool not in self.types:
            return False  # JSON's true is no count of nodes
        return isinstance(value, self.types)


NULL = type(None)


class Backend(ABC):
    """One cluster kind: how a new run gets its cluster, and how a recorded run finds it again.

    Importing a backend's module loads no boto3, paramiko or ray: the dry run asks the registry
    for a kind without paying for its clients.

    `record_fields` declares every field the kind's `to_record` writes: what each may hold and
    whether an older or damaged record may lack it. `clusters.from_record` checks a record
    against it before the backend reads a field, so a field a command needs to find and end what
    the run acquired is never read as its absence ("no job", "no target", "keep nothing")."""

    kind: ClassVar[str]
    record_fields: ClassVar[Mapping[str, RecordField]]

    @abstractmethod
    def from_plan(self, plan: Plan, options: LaunchOptions, run_dir: Path) -> Cluster:
        """The cluster a new run acquires its nodes from."""

    @abstractmethod
    def from_record(self, record: Mapping[str, Any], run_dir: Path | None = None) -> Cluster:
        """The cluster of a recorded run (run.json's `cluster`): it reaches and releases its
        nodes. `run_dir` (absolute): where the record was read; a record that holds paths is read
        against it, never against the directory the command runs in."""


# --- what a backend may declare ---------------------------------------------------------------


class WithReadyCheck(ABC):
    """The kind can check on this machine, before a run directory exists, that a run could start
    (aws: credentials and a known region). No cloud call."""

    @abstractmethod
    def check_ready(self, profile: Profile) -> None:
        """BadInput when a run could not start: a refusal leaves nothing behind."""


class WithLivePrice(ABC):
    """The kind can look the node's price up where it is sold (aws: AWS's own prices)."""

    @abstractmethod
    def live_price(
        self, recipe: Recipe, profile: Profile, fallback: Price | None
    ) -> tuple[Price | None, str | None]:
        """The price found, or the fallback and why it was kept; never raises for a failed
        lookup."""


class WithNodeShape(ABC):
    """The kind launches its nodes, so recipes whose launches would be the same can share one
    (`reproduce nightly`). A kind without it launches nothing: its nodes are there already."""

    @abstractmethod
    def node_shape(self, recipe: Recipe, profile: Profile) -> str:
        """Every launch setting, as text; BadInput for a profile that could not launch it."""


class WithFitCheck(ABC):
    """The kind can ask its cluster, before a run directory exists and anything is submitted,
    whether it can hold the recipe (slurm: the partition's nodes and GPUs per node, by sinfo)."""

    @abstractmethod
    def check_fits(self, recipe: Recipe, profile: Profile) -> None:
        """BadInput when the cluster cannot hold the recipe; nothing was submitted."""


class WithMultiNode(ABC):  # noqa: B024 - a marker: nothing to call
    """A run of this kind may span several nodes: it holds all the recipe's nodes at once or none
    (aws: one launch in one placement group; slurm: one job; ray: the cluster's nodes, which the
    job checks before training; ssh: the profile's hosts). On a kind without it a multi-node
    recipe is refused before anything starts: N paid nodes of which N-1 idle are worse. A marker:
    the runner asks `isinstance`, there is nothing to call."""


class WithJobTimeLimit(ABC):
    """The run's budget (--max-hours, --max-usd) becomes the scheduler's own time limit of the
    job (slurm: `--time`), so the nodes are given back at the limit even when no launcher is
    there to stop the run."""

    @abstractmethod
    def with_time_limit(
        self,
        recipe: Recipe,
        profile: Profile,
        max_hours: float | None,
        max_usd: float | None,
        price: float | None,
    ) -> Profile:
        """The profile whose job carries the limit (written to the run directory, so the dry run
        and the submission render the same job)."""


class WithOwnedNodes(ABC):  # noqa: B024 - a marker: nothing to call
    """The kind's nodes are the user's own, bought outside this tool (a Slurm partition): they
    have no list price, so a run's price is the profile's price_per_hour or --price-per-hour, or
    unknown, never the catalog's price of a cloud instance type. A marker."""


class WithProvisioning(ABC):
    """The kind launches its nodes with requests of its own (aws: EC2's), built offline into the
    plan so that the dry run shows them byte for byte, and can target one existing machine
    instead of launching (`--instance-id`)."""

    @abstractmethod
    def provisioning(
        self,
        recipe: Recipe,
        profile: Profile,
        run_id: str,
        *,
        owner: str,
        now: datetime,
        keep: bool,
    ) -> tuple[Any, ...]:
        """The launch's requests, in order, with placeholders where only the launch knows."""

    @abstractmethod
    def target_instance(self, profile: Profile, instance_id: str) -> Profile:
        """The profile of a run on this existing machine (never ended by the run)."""


class WithDryRunSection(ABC):
    """The kind sends something of its own to start a run (aws: its price lookup and launch
    requests; ray: the job submission; slurm: the batch script), which the dry run prints
    before node.sh, and says where node.sh runs."""

    node_script_where: ClassVar[str] = "run detached on the node"

    @abstractmethod
    def dry_run_section(self, plan: Plan, price: Price | None) -> list[str]:
        """The lines, byte for byte as the run sends them (no secret: none is in a plan)."""


BACKEND_CAPABILITIES: tuple[type[ABC], ...] = (
    WithReadyCheck,
    WithProvisioning,
    WithDryRunSection,
    WithFitCheck,
    WithLivePrice,
    WithNodeShape,
    WithMultiNode,
    WithJobTimeLimit,
    WithOwnedNodes,
)


# --- what a run's cluster may declare ----------------------------------------------------------


class WithBudgetWatch(ABC):
    """The cluster's acquire takes long enough to be billed (aws: a boot and its status checks),
    so it checks the run's budget while it acquires."""

    @abstractmethod
    def watch_budget(self, budget: Budget, started: float) -> None:
        """Handed over before acquire: the budget, and when the run's clock started."""


class WithNodeHealth(ABC):
    """The cluster can say, from outside the node, that a node is gone (aws: an instance
    terminated; ray: a GPU node dead)."""

    @abstractmethod
    def lost_nodes(self, *, now: bool = False) -> list[str]:
        """One sentence per lost node, naming it; `now`: ask afresh, not from a cache."""


class WithLeftovers(ABC):
    """The cluster's release ends what it made, and can say what is still allocated when a
    release did not finish."""

    @abstractmethod
    def leftovers(self) -> list[str]:
        """What is still allocated, by name (empty when nothing is)."""


class WithDownCommand(ABC):
    """The run launched its nodes: they bill until ended, and a command ends them from any
    terminal."""

    @abstractmethod
    def down_command(self) -> str:
        """The command that ends this run's nodes (`reproduce down ...`)."""


class WithNodeAfterRun(ABC):
    """What happens to the run's launched node once nobody follows the run has a rule of its own
    (aws: it ends itself a grace period after the run ends, or it is kept)."""

    @abstractmethod
    def node_after_run(self) -> str:
        """That rule, in words for the user who detaches."""


class WithOwnExecution(ABC):
    """The cluster's runs are not processes the launcher starts over a shell (a Ray cluster's job
    server): it drives each node's run itself instead of the node protocol over a Transport."""

    @abstractmethod
    def execution(self, node: Node, place: Place) -> Execution:
        """The node's run as the runner drives it."""


class WithSchedulerJob(ABC):
    """The run's nodes are a scheduler's job (slurm): it says when the job started and stopped
    holding them, and whether it ended or restarted the job for reasons of its own."""

    @abstractmethod
    def job_started_at(self) -> float | None:
        """When the job started holding its nodes (None: not yet known); the run's clock starts
        there, never while the job waited in the queue."""

    @abstractmethod
    def job_ended_at(self) -> float | None:
        """When the job stopped holding its nodes (None while it runs, or when nothing told);
        GPU-hours end there, not at the launcher's later release."""

    @abstractmethod
    def job_failure(self, *, now: bool = False) -> str | None:
        """Why the scheduler ended the job (NODE_FAIL, PREEMPTED, TIMEOUT, a requeue), naming
        the node(s); None when it did not. `now`: ask afresh."""


class WithAllocation(ABC):
    """The run's nodes are held apart from the run on them (slurm: an allocation, each run one
    job step of it). The runs of a nightly group then share one hold, acquired once and released
    once (launcher/runner/held.py), while each run keeps a cluster of its own: its own step, its
    state, its cancel and its clock, and a release that ends only that."""

    @abstractmethod
    def allocation(self, recipes: Sequence[Path]) -> Cluster:
        """The hold of a group of these recipes (this run's recipe first): a cluster whose
        acquire holds the nodes for all of them, and whose release ends it."""

    @abstractmethod
    def join(self, allocation: Cluster, nodes: list[Node]) -> list[Node]:
        """This run inside the acquired hold (`nodes`: what its acquire gave): the run's nodes."""


class WithLentNode(ABC):
    """The cluster's node was lent to this run by a nightly group (launcher/runner/held.py)."""

    @property
    @abstractmethod
    def lent_from(self) -> Path | None:
        """The run that acquired the group's node, once it is acquired (None: this run will)."""


class WithNodeShell(ABC):
    """`reproduce ssh` may open a shell on the run's nodes over SSH, with the run's own
    transport (its host keys checked as the run checked them), unless the cluster says why not
    now. A cluster that declares neither this nor WithStepShell gives no shell at all."""

    @abstractmethod
    def shell_refusal(self, run: str, state: str | None, node_run_dir: str) -> str | None:
        """Why no shell can be opened on this run's nodes now (its machine ended with it, it ran
        here), in one sentence for the user; None: connect."""


class WithStepShell(ABC):
    """`reproduce ssh` opens a shell on a node of the run's scheduler job as one more step of
    it, from the login node (Slurm's own authentication carries it to the node)."""

    @abstractmethod
    def step_argv(self, index: int, node_run_dir: str, remote: list[str]) -> list[str]:
        """The command, run on the login node, that opens the shell (or runs `remote`)."""

    @abstractmethod
    def step_transport(self) -> Transport | None:
        """The connection to the login node whose host key `ssh` pins (None: it is this host)."""


CLUSTER_CAPABILITIES: tuple[type[ABC], ...] = (
    WithNodeShell,
    WithStepShell,
    WithBudgetWatch,
    WithNodeHealth,
    WithLeftovers,
    WithDownCommand,
    WithNodeAfterRun,
    WithOwnExecution,
    WithSchedulerJob,
    WithAllocation,
    WithLentNode,
)


def execution_for(cluster: Cluster, node: Node, place: Place) -> Execution:
    """The cluster's own execution when it declares one, else the node protocol over the
    cluster's transport to the node."""
    if isinstance(cluster, WithOwnExecution):
        return cluster.execution(node, place)
    return WrapperExecution(node, cluster.transport(node), place)
