"""A node whose shell prints when it starts: every SSH command's answer is still only its own.

sshd runs each command through the user's shell, and that shell's start-up files run first: a
research box's `~/.bashrc` that echoes a banner, conda's or a module system's chatter, `BASH_ENV`.
What they print lands in the command's stdout, ahead of its answer. The launcher reads answers
(poll: `alive` / `exit N`; cancel: `left:`; collect; the stack and asset results), so noise there
would turn a healthy run into "unexpected answer while polling". The promise, kept once in
`SSHTransport.run`: a command's stdout is what the command printed, whatever the shell printed
before it. The adversary here is a BASH_ENV (read by every non-interactive bash, as `.bashrc` is
for sshd's) that prints answer-shaped lines, a line without its newline, and stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import assert_log_collected, slow_script_body
from support.nodescript import job, plan_running
from support.sshd import SshServer

from launcher.clusters.ssh import SSHCluster
from launcher.plan import protocol
from launcher.runner.runner import Runner

pytestmark = pytest.mark.ssh

NOISE = (
    "echo 'Welcome to the cluster'\n"
    "echo alive\n"
    "echo 'exit 0'\n"
    "echo 'left: everything'\n"
    "printf 'no newline at the end'\n"
    "echo 'banner on stderr' >&2\n"
)


@pytest.fixture
def noisy(tmp_path: Path):
    rc = tmp_path / "noisy-rc.sh"
    rc.write_text(NOISE)
    server = SshServer(tmp_path / "sshd", env={"BASH_ENV": str(rc)}).start()
    yield server
    server.stop()


def test_every_answer_is_the_commands_own_whatever_the_shell_printed_first(noisy, tmp_path):
    cluster = SSHCluster.from_profile(noisy.profile())
    t = cluster.transport(cluster.acquire()[0])
    try:
        res = t.run("echo out; echo err >&2; exit 3", check=False)
        assert (res.exit_code, res.stdout) == (3, "out\n")
        assert res.stdout.count("Welcome") == 0
        assert t.run("printf %s 'no newline'").stdout == "no newline"
        assert t.run("true").stdout == ""
        gone = t.run(protocol.poll_command(str(tmp_path / "no-such-run")), check=False)
        assert protocol.parse_poll(gone.stdout, gone.exit_code) == ("gone", None)
    finally:
        cluster.release()


def test_a_run_on_a_noisy_node_ends_done_with_every_log_byte(noisy, tmp_path, runs_root):
    rd, plan = job(runs_root, tmp_path / "node", slow_script_body(lines=20, delay_s=0.01))
    running = plan_running(rd.run_id, plan.node_run_dir, plan.node_script)
    cluster = SSHCluster.from_profile(noisy.profile())
    outcome = Runner(measure=False, poll_s=0.05).execute(running, rd, cluster)
    assert outcome.state == "done"
    assert rd.status()["state"] == "done"
    assert_log_collected(rd.path)
    train = (rd.logs / "train.log").read_text()
    assert "Welcome" not in train and train.count("train line") == 20
