"""A TCP proxy on 127.0.0.1 between the launcher and a server (sshd), in its own process, so a
test can make the network misbehave for real:

- `freeze()` (SIGSTOP): the proxy stops forwarding but its sockets stay open. The kernel still
  accepts new connections into the listen backlog and ACKs what is sent, so the client sees a
  half-open / black-holed connection: TCP up, nothing ever coming back.
- `thaw()` (SIGCONT): forwarding resumes where it stopped.
- `kill()`: the proxy dies; every connection through it ends (the path is gone).
- `start()` again: a new proxy on the same port (the path is back).

    python tests/support/proxy.py LISTEN_PORT TARGET_PORT     (prints "ready" once listening)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass


@dataclass
class Proxy:
    target_port: int
    port: int = 0
    proc: subprocess.Popen | None = None

    def start(self) -> Proxy:
        from .ports import free_port, wait_for_port

        self.port = self.port or free_port()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(self.port), str(self.target_port)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the proxy did not start")
        wait_for_port(self.port)
        return self

    def freeze(self) -> None:
        """Stop forwarding, and return only once it has stopped: kill() only queues SIGSTOP, and a
        forwarding thread running on another core goes on until the kernel interrupts it (on a
        busy machine, long enough to pass a request sent after this returned)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _all_stopped(self.proc.pid):
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not stop within 10 s of SIGSTOP")
            time.sleep(0.005)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # SIGKILL ends a stopped process too
            self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None


def _all_stopped(pid: int) -> bool:
    """Is every thread of `pid` stopped (state T in /proc/PID/task/*/stat)?"""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # a thread that ended
        states.append(stat[stat.rfind(")") + 2])
    return bool(states) and all(state in "Tt" for state in states)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(listen_port: int, target_port: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(64)
    print("ready", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target_port), timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
