"""Drawing a local distribution's progress: live bars on a terminal, plain lines elsewhere.

Owns how a :class:`ringseed.local.progress.View` reaches the user on stderr:

- :class:`Bars` (a terminal): a cluster line (nodes verified, bytes delivered against nodes x
  model size, origin read, rate, ETA) over one bar per node (bytes of the model, rate, state),
  redrawn in place with rich.
- :class:`Lines` (a pipe or a log file): one plain line every ``every`` seconds and one line per
  event (a node verified, a node with a problem, a node offline); never a carriage return.
- :class:`Silent`: nothing (``--progress off``).

:func:`choose` picks by ``--progress auto|bars|lines|off`` and whether stderr is a terminal.
"""

from __future__ import annotations

from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ringseed.local import progress
from ringseed.protocol import units


class Display(Protocol):
    def show(self, view: progress.View) -> None: ...

    def close(self, view: progress.View | None) -> None: ...


def cluster_line(view: progress.View) -> str:
    """One line for the whole swarm."""
    n = len(view.nodes)
    parts = [f"{view.elapsed:6.1f}s", f"nodes {view.verified}/{n} verified"]
    if view.model_bytes:
        parts.append(
            f"{units.format_size(view.delivered)} of {units.format_size(view.model_bytes * n)}"
            f" ({n} x {units.format_size(view.model_bytes)})"
        )
        parts.append(f"origin {units.format_size(view.origin_bytes)} ({view.origin_bytes / view.model_bytes:.2f}x)")
    else:
        parts.append("listing the source")
    parts.append(f"{units.format_size(view.rate)}/s")
    parts.append(f"ETA {view.eta_text}")
    return "  ".join(parts)


def node_line(row: progress.NodeRow) -> str:
    pct = 100.0 * row.bytes / row.total if row.total else 0.0
    text = f"{row.name}: {units.format_size(row.bytes)}/{units.format_size(row.total)} ({pct:.0f}%) {row.state}"
    return f"{text}: {row.message}" if row.message else text


class Lines:
    """Plain lines for logs: a periodic summary plus one line per node event."""

    def __init__(self, out: IO[str], *, every: float = 5.0) -> None:
        self.out = out
        self.every = every
        self._next = 0.0
        self._states: dict[str, str] = {}

    def show(self, view: progress.View) -> None:
        for row in view.nodes:
            if self._states.get(row.name, "waiting") != row.state and row.state not in (
                "fetching",
                "origin",
                "waiting",
            ):
                print(f"{view.elapsed:6.1f}s  {node_line(row)}", file=self.out, flush=True)
            self._states[row.name] = row.state
        if view.elapsed >= self._next:
            self._next = view.elapsed + self.every
            print(cluster_line(view), file=self.out, flush=True)

    def close(self, view: progress.View | None) -> None:
        if view is not None:
            print(cluster_line(view), file=self.out, flush=True)


class Bars:
    """Live bars on a terminal (rich), redrawn in place."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False)
        self.live.start()

    def render(self, view: progress.View) -> Group:
        table = Table.grid(padding=(0, 1))
        for _ in range(5):
            table.add_column()
        for row in view.nodes:
            total = row.total or 1
            bar = ProgressBar(total=total, completed=min(row.bytes, total), width=30)
            size = f"{units.format_size(row.bytes)}/{units.format_size(row.total)}" if row.total else "-"
            state = Text(row.state, style=_style(row.state))
            if row.message:
                state.append(f": {row.message}", style="dim")
            table.add_row(row.name, bar, size, f"{units.format_size(row.rate)}/s", state)
        return Group(Text(cluster_line(view), style="bold"), table)

    def show(self, view: progress.View) -> None:
        self.live.update(self.render(view), refresh=True)

    def close(self, view: progress.View | None) -> None:
        if view is not None:
            self.live.update(self.render(view), refresh=True)
        self.live.stop()


class Silent:
    def show(self, view: progress.View) -> None:
        return None

    def close(self, view: progress.View | None) -> None:
        return None


def _style(state: str) -> str:
    return {"verified": "green", "fetching": "cyan", "origin": "blue", "waiting": "dim"}.get(state, "red")


def choose(mode: str, out: IO[str]) -> Display:
    """The display for ``--progress`` ``mode`` writing to ``out`` (stderr)."""
    if mode == "off":
        return Silent()
    console = Console(file=out)
    if mode == "bars" or (mode == "auto" and console.is_terminal):
        return Bars(console)
    return Lines(out)
