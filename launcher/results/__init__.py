"""A finished run's results: measured and written once, then attested and verified.

evaluate.py  a run directory (or a bare log) judged: steps.jsonl, result.yaml, verdict.json,
             report.md, plots/ and report.html written, each through records/rundir.py's names

Above pages/ (it writes them) and below runner/ (which calls it at a run's end) and commands/
(`measure`, `compare`).
"""
