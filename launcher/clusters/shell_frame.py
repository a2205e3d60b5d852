"""What an SSH command printed, told apart from what the node's shell printed before it.

sshd runs each command through the user's shell, whose start-up files (a `.bashrc` that echoes a
banner, conda's chatter, BASH_ENV) run first and print into the same stdout; the answers the
launcher reads (poll, cancel, collect) must be the command's alone (docs/architecture.md). Kept
apart from the transport so the rule is one small piece: SSHTransport.run frames every command.
"""

from __future__ import annotations

import secrets
import shlex


def output_frame() -> str:
    """A line a command prints first, new for every command: everything up to it is the shell's.
    The command's own bash prints it after every start-up file has run, and a start-up file cannot
    forge a random line it never saw (tests/clusters/test_ssh_noisy_shell.py)."""
    return f"##reproduce-output-{secrets.token_hex(8)}"


def framed(command: str, frame: str) -> str:
    """The command as sent: the frame line first, then the command unchanged."""
    return f"printf '%s\\n' {shlex.quote(frame)}\n{command}"


def unframed(out: bytes, frame: str) -> bytes:
    """The command's own stdout: what follows the frame line (all of it when the shell never got
    to print one: bash missing on the node, say)."""
    mark = frame.encode() + b"\n"
    at = out.find(mark)
    return out if at < 0 else out[at + len(mark) :]
