"""The ``ringseed`` command.

Each subcommand lives in its own module, imported only when that subcommand runs, so that
``ringseed operator`` never imports torch and ``ringseed --help`` stays fast. A command module
exposes ``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args) -> int`` and
imports heavy dependencies inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Protocol

# (words) -> (module, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("operator",): ("ringseed.operator.command", "run the Kubernetes operator (kopf)"),
    ("master",): ("ringseed.master.command", "run a master: tracker (distribution) or coordinator (training)"),
    ("agent",): ("ringseed.agent.command", "run a node agent (distribution role)"),
    ("manifest",): ("ringseed.agent.manifest_command", "build and print the manifest of a source"),
    ("local", "distribute"): (
        "ringseed.local.distribute",
        "distribute a model to N local agents (cluster-free) and show progress",
    ),
    ("local", "allreduce"): (
        "ringseed.local.allreduce",
        "run a coordinator and N local peers and check an all-reduce",
    ),
}


class CommandModule(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _usage() -> str:
    lines = ["usage: ringseed COMMAND [ARGS...]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<20} {help_text}")
    lines.append("")
    lines.append("Run 'ringseed COMMAND --help' for a command's options.")
    return "\n".join(lines)


def _find(argv: Sequence[str]) -> tuple[tuple[str, ...], Sequence[str]] | None:
    for length in (2, 1):
        words = tuple(argv[:length])
        if words in COMMANDS:
            return words, argv[length:]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from ringseed import __version__

        print(__version__)
        return 0
    found = _find(argv)
    if found is None:
        print(f"ringseed: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    words, rest = found
    module_name, help_text = COMMANDS[words]
    module: CommandModule = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog="ringseed " + " ".join(words), description=help_text)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    module.configure(parser)
    args = parser.parse_args(rest)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return module.run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
