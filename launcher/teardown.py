"""Release a cluster on every way out: success, error, Ctrl-C, SIGTERM, SIGHUP.

Why a context manager of its own: leaking a GPU instance costs about $63 an hour, so teardown must
not depend on how the run ended. `always_release(cluster)` turns SIGTERM and SIGHUP into
`Interrupted` (so `finally` blocks run, as they do for Ctrl-C), and while the teardown itself runs,
a Ctrl-C does not stop it: the first two presses only print that teardown is in progress; a third
abandons it, and then exactly what is left and the command that ends it are printed.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from launcher.errors import InfraError, Interrupted, ReproduceError

PRESSES_TO_ABANDON = 3
CATCH = ("SIGTERM", "SIGHUP")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _install(names: tuple[str, ...], handler: Callable[..., Any]) -> dict[int, Any]:
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


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(
        f"stopped by {signal.Signals(signum).name}; everything launched is being torn down"
    )


class always_release:  # noqa: N801 - used as a function: `with always_release(cluster):`
    """`with always_release(cluster): ...` calls cluster.release() however the block ends."""

    def __init__(self, cluster: Any, *, log: Callable[[str], Any] = _stderr) -> None:
        self.cluster = cluster
        self.log = log
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Any:
        self._previous = _install(CATCH, _raise_interrupted)
        return self.cluster

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            failure = release_hard(self.cluster, self.log)
        finally:
            _restore(self._previous)
        if exc is not None:
            if failure is not None:
                self.log(f"error: {failure}")
            if isinstance(exc, KeyboardInterrupt):
                raise Interrupted(
                    "interrupted (Ctrl-C); "
                    + ("teardown did not finish" if failure else "everything launched was released")
                ) from None
            return False  # the block's own error wins; the teardown's was printed
        if failure is not None:
            raise failure
        return False


def release_hard(cluster: Any, log: Callable[[str], Any] = _stderr) -> ReproduceError | None:
    """Run cluster.release() to the end despite Ctrl-C; return the error saying what is left, if any."""
    presses = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal presses
        presses += 1
        if presses >= PRESSES_TO_ABANDON:
            raise Interrupted("teardown abandoned")
        log(
            f"teardown in progress: ending what this run launched (press Ctrl-C "
            f"{PRESSES_TO_ABANDON - presses} more time{'s' if PRESSES_TO_ABANDON - presses != 1 else ''} to abandon it)"
        )

    previous = _install(("SIGINT",) + CATCH, on_signal)
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
            except Exception as err:  # noqa: BLE001 - an unexpected failure must still be reported plainly
                error = InfraError(f"teardown failed: {type(err).__name__}: {err}")
                break
    finally:
        _restore(previous)
    return _leftover_error(cluster, error)


def _leftover_error(cluster: Any, error: ReproduceError | None) -> ReproduceError:
    left_fn = getattr(cluster, "leftovers", None)
    try:
        left = list(left_fn()) if callable(left_fn) else []
    except Exception:  # noqa: BLE001
        left = []
    command_fn = getattr(cluster, "down_command", None)
    command = command_fn() if callable(command_fn) else None
    if isinstance(error, InfraError) and "still allocated" in str(error):
        return error  # the backend already named what is left and how to end it
    parts = [f"teardown did not finish ({error})." if error else "teardown did not finish."]
    if left:
        parts.append(f"Still allocated: {', '.join(left)}.")
    if command:
        parts.append(f"End it with `{command}`.")
    return InfraError(" ".join(parts))
