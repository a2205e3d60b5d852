#!/usr/bin/env bash
# The single test command. On a fresh Debian 12 machine, as root (CI=true, no stdin):
#   tests/run.sh [pytest args...]
# installs what the tests need (docker.io, docker-registry, openssh-server, git, ...) only when
# missing, creates .venv and installs the package with its test extras, starts dockerd when it is
# not running, runs the lint/type gate (ruff; mypy of launcher/, and of scripts/ as Python 3.8 with
# mypy 1.15 in .venv/mypy-scripts: tests/mypy-scripts/), then runs pytest and exits with
# pytest's status. Idempotent: a second run reuses all of it (a few seconds before pytest starts).
# sshd and the registry are NOT started system-wide: the pytest fixtures start their own on free
# loopback ports (tests/conftest.py).
#
# Environment:
#   REPRODUCE_LINT=0            skip the gate that runs `ruff check .`, `ruff format --check .` and
#                               `mypy` first (default 1: any finding fails the run before pytest)
#   REPRODUCE_TEST_NO_DOCKER=1  neither start nor require dockerd (the docker tests are skipped)
#   REPRODUCE_DOCKERD_ARGS      extra dockerd flags when this script starts it, e.g.
#                               "--bridge=none --iptables=false" in a chroot (tests/fresh-debian/)
#   REPRODUCE_TEST_LOG_DIR      where apt, pip and dockerd logs go (default /var/log/reproduce-tests)
#   REPRODUCE_TEST_ARTIFACTS    where the page tests keep their screenshots (default
#                               $REPRODUCE_TEST_LOG_DIR/artifacts; docs/report.md)
#   REPRODUCE_TEST_WORKERS      pytest-xdist workers (default 3; 0 runs the tests in this process)
#   REPRODUCE_TEST_NO_BROWSER=1 skip the headless-chromium page tests (without it, no chromium fails them)
#
# Check this script on a bare Debian 12 root: tests/fresh-debian/run.sh (docs/testing.md).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export DEBIAN_FRONTEND=noninteractive
LOG_DIR="${REPRODUCE_TEST_LOG_DIR:-/var/log/reproduce-tests}"
mkdir -p "$LOG_DIR"

say() { printf 'tests/run.sh: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  say "run me as root (I install packages and start dockerd)"
  exit 2
fi

# --- system packages, only the missing ones ---
# Every program the tests, their fixtures (tests/support/) and the code under test call:
#   docker.io          docker, dockerd (+ containerd, runc)  tests/support/docker.py, the local backend
#   docker-registry    /usr/bin/docker-registry              tests/support/docker.py
#   openssh-server     /usr/sbin/sshd                        tests/support/sshd.py
#   openssh-client     ssh-keygen                            tests/support/sshd.py
#   procps             ps, pkill                             tests/support/, the node wrapper (runner)
#   git                git                                   tests/scripts/test_node_scripts_stack_probe.py
#   python3, python3-venv, python3-pip, ca-certificates      .venv and pip over HTTPS
#   iproute2, tar, coreutils, util-linux (setsid), bash      present on Debian; listed to be sure
#   chromium           headless browser                      tests/pages/test_pages_browser.py (tests/support/browser.py)
#   fonts-dejavu-core, fonts-liberation2  fonts the pages render with in chromium's screenshots
#   tmux               a real terminal emulator whose screen   tests/support/screen.py (what stays
#                      the tests read back (capture-pane)      on screen: the live line, Ctrl-C)
#   slurmctld, slurmd, slurm-client, munge                   tests/support/slurm_cluster.py (a
#                      2-node Slurm 22.05 cluster on loopback; sbatch, squeue, scontrol, sinfo,
#                      scancel for the slurm backend: tests/clusters/slurm/)
PACKAGES=(docker.io docker-registry openssh-server openssh-client iproute2 procps git
          python3 python3-venv python3-pip ca-certificates tar coreutils util-linux bash
          chromium fonts-dejavu-core fonts-liberation2 tmux
          slurmctld slurmd slurm-client munge)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq </dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >"$LOG_DIR/apt.log" 2>&1 \
    || { tail -n 40 "$LOG_DIR/apt.log" >&2; exit 1; }
fi

# --- the virtual environment, reinstalled only when pyproject.toml or tests/constraints.txt changed ---
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
stamp=".venv/.reproduce-installed"
want="$(cat pyproject.toml tests/constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c "import launcher, pytest, ray" 2>/dev/null; then
  say "installing the package and its test extras into .venv"
  .venv/bin/python -m pip install -q --upgrade pip </dev/null >"$LOG_DIR/pip.log" 2>&1 || true
  .venv/bin/python -m pip install -q -e '.[test]' -c tests/constraints.txt </dev/null >>"$LOG_DIR/pip.log" 2>&1 \
    || { tail -n 40 "$LOG_DIR/pip.log" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

# --- scripts/' own mypy (tests/mypy-scripts/mypy.ini says why it is not .venv's), in its own venv ---
if [ "${REPRODUCE_LINT:-1}" = "1" ]; then
  tools=".venv/mypy-scripts"
  want_tools="$(sha256sum tests/mypy-scripts/requirements.txt | cut -d' ' -f1)"
  if [ ! -f "$tools/.installed" ] || [ "$(cat "$tools/.installed")" != "$want_tools" ]; then
    say "installing scripts/' mypy into $tools"
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install -q -r tests/mypy-scripts/requirements.txt </dev/null \
      >>"$LOG_DIR/pip.log" 2>&1 || { tail -n 40 "$LOG_DIR/pip.log" >&2; exit 1; }
    echo "$want_tools" > "$tools/.installed"
  fi
fi

# --- dockerd ---
if [ "${REPRODUCE_TEST_NO_DOCKER:-0}" != "1" ] && ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    say "starting docker (systemd)"
    systemctl start docker >/dev/null 2>&1 || true
  fi
  if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $LOG_DIR/dockerd.log)"
    # shellcheck disable=SC2086  # REPRODUCE_DOCKERD_ARGS is a list of flags, split on purpose
    nohup dockerd ${REPRODUCE_DOCKERD_ARGS:-} >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
  fi
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    say "dockerd did not come up; its log:"
    tail -n 40 "$LOG_DIR/dockerd.log" >&2 || true
    exit 1
  fi
fi

# sshd's privilege separation directory (the fixture's sshd needs it; systemd usually makes it)
mkdir -p /run/sshd

# --- the lint/type gate (pyproject.toml configures ruff and mypy) ---
if [ "${REPRODUCE_LINT:-1}" = "1" ]; then
  failed=()
  say "ruff check ."
  .venv/bin/ruff check . || failed+=("ruff check")
  say "ruff format --check ."
  .venv/bin/ruff format --check . || failed+=("ruff format --check")
  say "mypy"
  .venv/bin/mypy || failed+=("mypy")
  say "mypy scripts/ (as Python 3.8)"
  .venv/mypy-scripts/bin/mypy --config-file tests/mypy-scripts/mypy.ini || failed+=("mypy scripts")
  if [ "${#failed[@]}" -gt 0 ]; then
    say "lint/type gate failed: $(IFS=';'; echo "${failed[*]}") (pytest not started)"
    exit 1
  fi
fi

# Python's bytecode cache on, and filled first: a run starts about 1,000 interpreters (the CLI, the
# node programs, the stand-in miles, the workers), and where PYTHONDONTWRITEBYTECODE is set (this
# workplace sets it) a fresh checkout has no .pyc, so each of them compiled every module it imports
# again (a dry run 0.29 vs 0.22 CPU-s; collection with pytest's assertion rewriting 9.7 vs 3.3;
# docs/testing.md). The node programs' .pyc reach the containers through the scripts mount.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 launcher scripts tests >/dev/null 2>&1 || true

# three workers on CI's two cores (one more than cores: the third fills the time the others wait on
# a server or a poll; measured faster, docs/testing.md), whole files per worker
# (a module's fixtures, a Ray cluster, start once), in tests/conftest.py's file order (xdist's
# own, the load test first); the 30 slowest tests printed at the end
set +e
.venv/bin/pytest -n "${REPRODUCE_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder \
  --durations=30 "$@"
status=$?
set -e
exit "$status"
