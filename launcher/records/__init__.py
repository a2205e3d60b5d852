"""What a run leaves behind and how it is found again.

rundir.py        the run directory: every file name once, atomic writes, Timeline, run ids
runs.py          every run directory read back: state, stage, step, cost so far
history.py       the SQLite index of runs and the regression rules
history_rows.py  one history row read from a run directory

Below the plan and the clusters (they write run.json and aws.json through RunDir), above judge
(a history row carries a verdict).
"""
