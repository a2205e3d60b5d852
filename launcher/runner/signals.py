"""Signals and the release of a cluster: a paid node must not outlive the run by accident.

Leaking a GPU instance costs about $63 an hour, so the runner releases the cluster on every way
out (success, error, Ctrl-C, SIGTERM, SIGHUP) except a deliberate detach or a lost connection.
While a run is followed, SIGTERM and SIGHUP raise `Terminated` (a KeyboardInterrupt), so they take
the Ctrl-C path and cancel the run on its node (nobody is there to ask). While the release itself
runs, a Ctrl-C does not stop it: the first presses only say that teardown is in progress; the
third abandons it, and then what is left and the command that ends it are reported. SIGTERM and
SIGHUP never stop a release at all: they come from no person (a closed terminal may send SIGHUP
more than once), and the release is what they asked for.

An interrupt is never lost. Python raises a signal's exception in whatever Python code runs when
its handler does, and when that is a finalizer (`Popen.__del__` runs after every node command; any
`__del__`), the exception is printed as "Exception ignored in ..." and dropped: the launcher would
go on following a run nobody wants any more. So the handlers installed here also record the signal,
and the loops that follow a run call `raise_pending()` at every turn: a signal whose exception was
dropped is raised there; `handled()` marks it received where it is caught.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from launcher.clusters.base import Cluster
from launcher.clusters.contract import WithDownCommand, WithLeftovers
from launcher.errors import InfraError, Interrupted, ReproduceError

PRESSES_TO_ABANDON = 3
CANCELLING = ("SIGTERM", "SIGHUP")

_Handler = Callable[[int, FrameType | None], Any]


class Terminated(KeyboardInterrupt):  # noqa: N818 - a kind of KeyboardInterrupt, named as such
    """SIGTERM or SIGHUP while a run is followed: the run is cancelled (nobody to ask)."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


def _install(names: tuple[str, ...], handler: _Handler) -> dict[int, Any]:
    """Set handlers (main thread only: Python delivers signals there); return the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for name in names:
        sig = getattr(signal, name, None)
        if sig is not None:
            previous[sig] = signal.signal(sig, handler)
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# The signal received while a run is followed whose exception may not have reached the code yet
# (one at most: the first; a second Ctrl-C while it is handled means the same).
_pending: list[str] = []


def _interruption(signame: str) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signame == "SIGINT" else Terminated(signame)


def _raise_interruption(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if not _pending:
        _pending.append(name)
    raise _interruption(name)


def raise_pending() -> None:
    """Raise the interrupt received but dropped on its way (its exception raised in a finalizer);
    nothing when there is none. Called by every loop that waits on a node."""
    if _pending:
        raise _interruption(_pending.pop())


def handled() -> None:
    """The interrupt reached the code that acts on it: it is no longer pending."""
    _pending.clear()


@contextmanager
def signals_cancel() -> Iterator[None]:
    """Within the block Ctrl-C raises KeyboardInterrupt and SIGTERM/SIGHUP raise Terminated, each
    recorded until handled (never lost: raise_pending); the previous handlers come back."""
    handled()
    # A Ctrl-C ignored on purpose (a background job of a script: its shell ignores SIGINT for it)
    # stays ignored; otherwise it is recorded like the others.
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    previous = _install(CANCELLING if ignored else ("SIGINT",) + CANCELLING, _raise_interruption)
    try:
        yield
    finally:
        _restore(previous)


def release_hard(
    cluster: Cluster, warn: Callable[[str], Any] = lambda text: None
) -> ReproduceError | None:
    """Run cluster.release() to the end despite Ctrl-C; return the error saying what is left."""
    presses = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        if signum != signal.SIGINT:
            warn("teardown in progress: ending what this run launched")
            return
        presses += 1
        if presses >= PRESSES_TO_ABANDON:
            raise Interrupted("teardown abandoned")
        more = PRESSES_TO_ABANDON - presses
        warn(
            "teardown in progress: ending what this run launched (press Ctrl-C "
            f"{more} more time{'s' if more != 1 else ''} to abandon it)"
        )

    previous = _install(("SIGINT",) + CANCELLING, on_signal)
    error: ReproduceError | None = None
    try:
        for _ in range(PRESSES_TO_ABANDON):
            try:
                cluster.release()
                return None
            except (KeyboardInterrupt, Interrupted) as err:
                error = Interrupted(str(err) or "teardown interrupted")
                if presses >= PRESSES_TO_ABANDON:
                    break
                continue  # release is resumable: go on from where it stopped
            except ReproduceError as err:
                error = err
                break
            except Exception as err:  # noqa: BLE001 - an unexpected failure is still reported plainly
                error = InfraError(f"teardown failed: {type(err).__name__}: {err}")
                break
    finally:
        _restore(previous)
    return leftover_error(cluster, error)


def leftover_error(cluster: Cluster, error: ReproduceError | None) -> ReproduceError:
    """The teardown's failure as the user needs it: what is still allocated, how to end it."""
    try:
        left = list(cluster.leftovers()) if isinstance(cluster, WithLeftovers) else []
    except Exception:  # noqa: BLE001 - listing what is left must not hide the teardown's own error
        left = []
    command = cluster.down_command() if isinstance(cluster, WithDownCommand) else None
    if isinstance(error, InfraError) and "still allocated" in str(error):
        return error  # the backend already named what is left and how to end it
    parts = [f"teardown did not finish ({error})." if error else "teardown did not finish."]
    if left:
        parts.append(f"Still allocated: {', '.join(left)}.")
    if command:
        parts.append(f"End it with `{command}`.")
    return InfraError(" ".join(parts))


def settle_streams() -> None:
    """Before the process exits: a terminal that closed under the run (SIGHUP, then EIO on every
    write) must not turn the exit code into Python's 120 (a failed flush at exit). A stream that
    cannot be flushed now is pointed at /dev/null, so what is still buffered goes nowhere and the
    documented exit code stands."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, stream.fileno())
                os.close(null)
                stream.flush()
            except (OSError, ValueError):
                pass


def report_thread_failures() -> None:
    """No thread prints a traceback: an exception that ends a background thread is one line on
    stderr, as every other failure is one paragraph (docs/architecture.md, the error contract).

    Why: Python's default hook prints the whole traceback. paramiko reads a file with a thread of
    its own that sends the read requests (`_prefetch_thread`); when the node goes away mid-read
    (a node unreachable mid-run, which the launcher handles by detaching with a hint), that thread
    dies with `OSError: Socket is closed`, and its traceback would land in the middle of the
    hint. A connection lost inside paramiko's own threads is said by the main
    thread already, so it is dropped here; anything else is one warning line."""
    import sys
    import traceback

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        frames = traceback.extract_tb(args.exc_traceback) if args.exc_traceback else []
        inside_paramiko = bool(frames) and "paramiko" in frames[-1].filename.split("/")
        lost = any(
            c.__name__ in ("OSError", "EOFError", "SSHException") for c in args.exc_type.__mro__
        )
        if inside_paramiko and lost:
            return  # the main thread reports the lost connection
        name = args.thread.name if args.thread is not None else "a thread"
        try:
            print(
                f"warning: background work ({name}) stopped: "
                f"{args.exc_type.__name__}: {args.exc_value}",
                file=sys.stderr,
            )
        except (OSError, ValueError):
            pass  # stderr is gone: the exit code still tells

    threading.excepthook = hook
