"""The run's progress as a person sees it: a live status line on a terminal, plain lines elsewhere.

Why two renderings: at a terminal a person wants one line that moves (the stage, its elapsed
time, the running cost, a transfer's bytes with its rate and ETA, step N of M with the current
tokens/s) and the events above it; in a log, CI or a nightly's mail, a redrawn line is noise, so
the same events become plain lines, transfers throttled to one line every PLAIN_EVERY_S seconds.
Events come from the runner through the Reporter protocol (launcher/runner/reporter.py); the
cost gate's header and question are shown here too (launcher/cost/costgate.py).
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Any

from launcher.excerpt import printable

PLAIN_EVERY_S = 15.0  # at most one plain progress line per stage this often (plus the last one)
RATE_WINDOW_S = 20.0  # the rate (and the ETA) is measured over about this much recent time
_UNITS = ("B", "kB", "MB", "GB", "TB")
INTERRUPT_QUESTION = (
    "\ninterrupted: [C]ancel the run on the node (Enter), or [d]etach and leave it running? [C/d] "
)
# The keys of the question: one key answers it (no Enter needed); Enter takes the default.
INTERRUPT_KEYS = {"c": "cancel", "\r": "cancel", "\n": "cancel", "d": "detach"}


def read_key(fd: int) -> str:
    """One key from the terminal `fd`, without waiting for Enter (cbreak: Ctrl-C still raises
    KeyboardInterrupt); "" at the end of input. The terminal's mode is always put back."""
    import os
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        return os.read(fd, 1).decode(errors="replace")
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def interrupt_choice(keys: Any) -> str:
    """The answer to INTERRUPT_QUESTION from keys pressed (an iterator of one-char strings):
    c or Enter cancel, d detaches, the end of input cancels; another key is not an answer."""
    for key in keys:
        if not key:
            return "cancel"
        choice = INTERRUPT_KEYS.get(key.lower())
        if choice is not None:
            return choice
    return "cancel"


def same_terminal(one: Any, other: Any) -> bool:
    """Are two streams the same terminal? (stdout and the console's stderr, at a shell)"""
    import os

    try:
        if not (one.isatty() and other.isatty()):
            return False
        return os.path.samestat(os.fstat(one.fileno()), os.fstat(other.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


def human_bytes(n: float) -> str:
    """Decimal units, as docker and the clouds print sizes: 15.2 GB."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover - the loop returns


def clock(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Transfer:
    """One stage's progress lines, with a rate over the recent past and an ETA from it."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.done = 0
        self.total: int | None = None
        self.unit = "bytes"
        self.item = ""
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def update(self, progress: Any, now: float) -> None:
        self.done, self.total = int(progress.done), progress.total
        self.unit, self.item = progress.unit, progress.item
        self.samples.append((now, self.done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()

    @property
    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 and d1 >= d0 else None

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if self.total is None or not rate or rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / rate)

    @property
    def fraction(self) -> float | None:
        return None if not self.total else min(1.0, self.done / self.total)

    def amount(self, value: float) -> str:
        return human_bytes(value) if self.unit == "bytes" else f"{value:,.0f} {self.unit}"

    def words(self) -> str:
        """8.1 GB of 15.2 GB (53%), 62.3 MB/s, ETA 1m54s, layer 5/12."""
        text = self.amount(self.done)
        if self.total is not None:
            text += f" of {self.amount(self.total)} ({100 * (self.fraction or 0):.0f}%)"
        rate = self.rate
        if rate is not None:
            text += f", {self.amount(rate)}/s"
        if self.eta_s is not None and self.done < (self.total or 0):
            text += f", ETA {clock(self.eta_s)}"
        return text + (f", {self.item}" if self.item else "")


class ConsoleReporter:
    """The runner's events on stderr: a live line at a terminal (rich), plain lines otherwise.

    `live` None decides by the console: a terminal gets the live line. A nightly passes False.
    """

    def __init__(self, console: Any = None, *, live: bool | None = None) -> None:
        if console is None:
            from rich.console import Console

            console = Console(stderr=True, highlight=False)
        self.console = console
        self.live_wanted = bool(console.is_terminal and not console.is_dumb_terminal)
        if live is not None:
            self.live_wanted = live and self.live_wanted
        self.started = time.monotonic()
        self._live: Any = None
        self.stage_name: str | None = None
        self.stage_started: float | None = None
        self.transfers: dict[str, Transfer] = {}
        self._printed: dict[str, float] = {}
        self.steps: tuple[int, int | None] | None = None
        self.step_seconds: float | None = None
        self.usd_per_hour: float | None = None
        self.cost_since: float | None = None  # wall clock: when the paid time began
        self.tokens_per_step: int | None = None
        self.gpus: int | None = None

    # --- what a run costs, and the question ---------------------------------------------------

    def cost(self, gate: Any) -> None:
        """The plan's header and its cost before anything is paid for; the clock starts here
        (acquiring follows at once: a cloud bills from the launch)."""
        self.usd_per_hour = gate.usd_per_hour
        self.cost_since = time.time()
        self.tokens_per_step = gate.tokens_per_step
        self.gpus = gate.nodes * gate.gpus_per_node
        title = "this run LAUNCHES paid nodes" if gate.launches else "this run"
        self._print(f"reproduce: {title}", style="bold" if gate.launches else None)
        for line in gate.header:
            self._print(f"  {line}", style="bold" if line.startswith("worst") else None)

    def resume(self, record: dict[str, Any], acquired_at: float | None) -> None:
        """An attached run: its price from run.json, its paid time from its acquisition."""
        cost = record.get("cost") or {}
        price = cost.get("price_per_hour")
        if isinstance(price, (int, float)):
            self.usd_per_hour = float(price) * int(cost.get("nodes") or 1)
        self.cost_since = acquired_at
        self.tokens_per_step = cost.get("tokens_per_step")
        if cost.get("gpus_per_node"):
            self.gpus = int(cost["gpus_per_node"]) * int(cost.get("nodes") or 1)

    def confirm(self, question: str) -> bool:
        """y/yes goes on; anything else, an end of input or Ctrl-C is a no. Only a terminal is
        asked: a pipe on stdin is nobody's answer."""
        self._stop_live()
        if not sys.stdin or not sys.stdin.isatty():
            return False
        try:
            self.console.file.write(question)
            self.console.file.flush()
            answer = sys.stdin.readline()
        except KeyboardInterrupt:
            return False
        return answer.strip().lower() in ("y", "yes")

    # --- events ---------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A closed terminal (EIO after SIGHUP) or a closed pipe drops the line, nothing more.
        The text is made printable: the runner's events quote the node (launcher/excerpt.py)."""
        elapsed = time.monotonic() - self.started
        try:
            self.console.print(
                f"[{elapsed:7.1f}s] {printable(text, keep=chr(10))}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        except (OSError, ValueError):
            return

    def stage(self, name: str, event: str, status: str) -> None:
        cost = self.cost_words()
        if event == "start":
            self.stage_name, self.stage_started = name, time.monotonic()
            self.say(f"stage {name} started" + (f" ({cost})" if cost else ""))
            self._start_live()
        else:
            began = self.stage_started if self.stage_name == name else None
            took = time.monotonic() - began if began is not None else None
            transfer = self.transfers.pop(name, None)
            if transfer is not None and not self.live_wanted:
                self._plain_progress(transfer, force=True)
            self.say(
                f"stage {name} {status}"
                + (f" after {clock(took)}" if took is not None else "")
                + (f" ({cost})" if cost else "")
            )

    def step(self, done: int, total: int | None) -> None:
        self.steps = (done, total)
        if self._live is None:
            speed = self.speed_words()
            self.say(
                f"train step {done}"
                + (f" of {total}" if total else "")
                + (f" ({speed})" if speed else "")
            )

    def step_time(self, step: int, seconds: float) -> None:
        if seconds > 0:
            self.step_seconds = seconds

    def progress(self, progress: Any) -> None:
        transfer = self.transfers.setdefault(progress.stage, Transfer(progress.stage))
        transfer.update(progress, time.monotonic())
        if not self.live_wanted:
            self._plain_progress(transfer)
            return
        if transfer.total is not None and transfer.done >= transfer.total:
            # finished: its bar goes, one line above the live line says what it moved
            del self.transfers[progress.stage]
            if self._printed.get(progress.stage) != float("inf"):
                self._printed[progress.stage] = float("inf")
                self.say(f"{transfer.stage}: {transfer.words()}")
            return
        self._printed.pop(progress.stage, None)
        self._start_live()

    def warn(self, text: str) -> None:
        text = printable(text, keep="\n")  # a warning may quote the node
        try:
            if self._live is not None:
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            else:
                print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            return

    def choose(self) -> str:
        """Ask on the terminal; without one (or on a second Ctrl-C) the run is cancelled."""
        self._stop_live()
        if not sys.stdin or not sys.stdin.isatty():
            return "cancel"
        try:
            out = self.console.file
            out.write(INTERRUPT_QUESTION)
            out.flush()
            fd = sys.stdin.fileno()
            choice = interrupt_choice(read_key(fd) for _ in range(64))
            out.write(("d" if choice == "detach" else "c") + "\n")
            out.flush()
        except (KeyboardInterrupt, EOFError):
            return "cancel"
        except (OSError, ValueError):  # not a real terminal after all (termios refused it)
            return "cancel"
        return choice

    def close(self) -> None:
        """The run is over: the live line goes (the lines above it stay)."""
        self._stop_live()

    # --- words ----------------------------------------------------------------------------------

    def cost_words(self) -> str:
        if self.usd_per_hour is None or self.cost_since is None:
            return ""
        spent = max(0.0, time.time() - self.cost_since) / 3600.0 * self.usd_per_hour
        return f"${spent:,.2f} so far at ${self.usd_per_hour:,.2f}/h"

    def speed_words(self) -> str:
        """The current step's speed, in the claim's unit when the recipe says enough."""
        if self.step_seconds is None:
            return ""
        if self.tokens_per_step and self.gpus:
            per_gpu = self.tokens_per_step / self.step_seconds / self.gpus
            return f"{per_gpu:,.0f} tokens/s/GPU, {self.step_seconds:.2f} s/step"
        return f"{self.step_seconds:.2f} s/step"

    def status_line(self) -> str:
        """The live line's text: where the run is, for how long, and what it has cost."""
        now = time.monotonic()
        parts = [f"{self.stage_name or 'starting'} {clock(now - (self.stage_started or now))}"]
        if self.steps is not None and self.stage_name == "train":
            done, total = self.steps
            parts.append(f"step {done}" + (f" of {total}" if total else ""))
            if self.speed_words():
                parts.append(self.speed_words())
        parts.append(f"run {clock(now - self.started)}")
        if self.cost_words():
            parts.append(self.cost_words())
        return " · ".join(parts)

    # --- rendering ------------------------------------------------------------------------------

    def __rich__(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 1))
        grid.add_row(Text(self.status_line(), style="bold"))
        for transfer in self.transfers.values():
            row = Table.grid(padding=(0, 1))
            fraction = transfer.fraction
            bar = ProgressBar(
                total=100.0 if fraction is not None else None,
                completed=100.0 * (fraction or 0.0),
                width=30,
            )
            row.add_row(Text(f"  {transfer.stage}"), bar, Text(transfer.words()))
            grid.add_row(row)
        return grid

    def _start_live(self) -> None:
        if not self.live_wanted or self._live is not None:
            return
        from rich.live import Live

        try:
            # Lines other code prints to stdout while the live line is up (the AWS backend's
            # "aws: terminating ...", "aws: everything this run created is gone", a kept node's
            # price) are drawn above it and stay; only when stdout is this very terminal: a
            # redirected stdout keeps its own bytes.
            self._live = Live(
                self,
                console=self.console,
                refresh_per_second=4,
                transient=True,
                redirect_stdout=same_terminal(sys.stdout, self.console.file),
                redirect_stderr=False,
            )
            self._live.start()
        except (OSError, ValueError):
            self._live = None
            self.live_wanted = False

    def _stop_live(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            try:
                live.stop()
            except (OSError, ValueError):
                pass

    def _plain_progress(self, transfer: Transfer, *, force: bool = False) -> None:
        now = time.monotonic()
        finished = transfer.total is not None and transfer.done >= transfer.total
        last = self._printed.get(transfer.stage)
        if not force and not finished and last is not None and now - last < PLAIN_EVERY_S:
            return
        if finished and last == float("inf"):
            return  # the last line was printed already
        self._printed[transfer.stage] = float("inf") if finished else now
        self.say(f"{transfer.stage}: {transfer.words()}")

    def _print(self, text: str, style: str | None = None) -> None:
        text = printable(text, keep="\n")
        try:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True, style=style)
        except (OSError, ValueError):
            return
