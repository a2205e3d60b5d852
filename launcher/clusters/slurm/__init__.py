"""`kind: slurm`: a run as one Slurm batch job (cluster.py), its script (script.py), each node's
part of it (execution.py); a nightly group as one allocation and a job step per run (step.py);
the backend (backend.py). docs/slurm.md."""

from launcher.clusters.slurm.backend import BACKEND, SlurmBackend

__all__ = ["BACKEND", "SlurmBackend"]
