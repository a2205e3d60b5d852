"""`kind: slurm`: a run as one Slurm batch job (cluster.py), its script (script.py), each node's
part of it (execution.py). docs/slurm.md."""

from launcher.clusters.slurm.cluster import check_fits, from_plan, from_record, live_price

__all__ = ["check_fits", "from_plan", "from_record", "live_price"]
