"""What a run costs before and while it is paid for.

estimate.py  expected GPU-hours by stage (cold node, warm store, warm cache), each figure sourced
costgate.py  the cost before anything is paid for: header, worst case, ask / --yes / budget
budget.py    --max-usd / --max-hours, checked while the run goes on
"""
