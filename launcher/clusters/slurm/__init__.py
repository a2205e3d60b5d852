"""`kind: slurm`: a run as one Slurm batch job (cluster.py), its script (script.py), each node's
part of it (execution.py). docs/slurm.md."""

from launcher.clusters.slurm.cluster import BACKEND, SlurmBackend

__all__ = ["BACKEND", "SlurmBackend"]
