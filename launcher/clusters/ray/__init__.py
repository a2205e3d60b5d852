"""An existing Ray cluster: the cluster side (cluster.py) and a run as one Ray job (jobs.py)."""
