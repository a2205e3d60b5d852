"""Pure judgement: a log's step records and a run's timeline -> figures -> a verdict.

parse/          miles' text log -> StepRecords (lines.py: one line's shapes; miles.py: the log)
evidence.py     is the log a run of the recipe, do its sources agree (the gate)
measure.py      Recipe + steps + timeline -> Result (and where the GPU-hours went)
verdict.py      Result vs the claim -> Verdict; the tolerance is defined here
convergence.py  loss-curve comparison of two runs

No file is read or written here (principle 4 of docs/architecture.md): the same inputs give the
same answer offline, which is what `measure RUN_DIR` and a re-measurement rely on.
"""
