"""The train stage of node.sh: the recipe's run block, once, or K times for K measured runs.

Why a loop inside node.sh and not K launches: the K runs share one acquired node and everything
before training (the pull, the checks, the assets, Ray): a p5en bills about $63/h, so nothing is
provisioned or staged again between runs, and the runner follows one node.log as for one run.

Each measured run is one `train` stage (its own start and end markers), so the timeline holds
K `train` stages in order, the k-th is run k, and the launcher splits node.log by them into
measured/<k>/ (launcher/results/measured_runs.py). A run block runs in a subshell: its `cd`,
`export` or `exit` cannot leak into the next run, and every run starts from the same
environment. REPRODUCE_MEASURED_RUN (1..K) and REPRODUCE_MEASURED_RUNS (K) tell a run which it
is. Each run writes into a directory of its own, $REPRODUCE_OUT_DIR/run-<k>: a run block that saves
a checkpoint there and loads one from there (`--save`/`--load`) would otherwise resume run 2 from
run 1's end and measure other steps, or none. The first run that fails ends the loop (set -e):
the runs after it would be paid for and could not change the verdict (a failed run fails the
whole: docs/measurement.md).

K = 1 renders the train stage exactly as before (no loop, no subshell).
"""

from __future__ import annotations


def train_lines(title: str, miles_dir: str, run_block: str, runs: int) -> list[str]:
    """The train stage's lines in the container script, for `runs` measured runs."""
    if runs <= 1:
        return [
            f"# ---- stage train: {title}",
            "_stage_begin train",
            f"cd {miles_dir}",
            "# ----- recipe run block (verbatim) -----",
            run_block,
            "# ----- end of recipe run block -----",
            "_stage_end",
        ]
    return [
        f"# ---- stage train, {runs} measured runs (result.runs), each its own train stage: "
        f"{title}",
        f"export REPRODUCE_MEASURED_RUNS={runs}",
        f"for REPRODUCE_MEASURED_RUN in $(seq 1 {runs}); do",
        "export REPRODUCE_MEASURED_RUN",
        "_stage_begin train",
        "(",
        "# each run its own output directory: none resumes from the one before",
        'export REPRODUCE_OUT_DIR="$REPRODUCE_OUT_DIR/run-$REPRODUCE_MEASURED_RUN"',
        'mkdir -p "$REPRODUCE_OUT_DIR"',
        f"cd {miles_dir}",
        "# ----- recipe run block (verbatim) -----",
        run_block,
        "# ----- end of recipe run block -----",
        ")",
        "_stage_end",
        "done",
    ]
