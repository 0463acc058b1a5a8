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

from ringseed import cmdline

# (words) -> (module, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("operator",): ("ringseed.operator.command", "run the Kubernetes operator (kopf)"),
    ("master",): ("ringseed.master.command", "run a master: tracker (distribution) or coordinator (training)"),
    ("agent",): ("ringseed.agent.command", "run a node agent (distribution role; --role cache: the cache role)"),
    ("manifest",): ("ringseed.agent.manifest_command", "build and print the manifest of a source"),
    ("mount",): ("ringseed.fs.mount_command", "mount this node's cache tree (ringseed://) with FUSE"),
    ("local", "distribute"): (
        "ringseed.local.distribute",
        "distribute a model to N local agents (cluster-free) and show progress",
    ),
    ("local", "checkpoint"): (
        "ringseed.local.checkpoint",
        "save a checkpoint into N local cache agents, kill the writer's node and restore it",
    ),
    ("local", "allreduce"): (
        "ringseed.local.allreduce",
        "run a coordinator and N local peers and check an all-reduce",
    ),
}


# (words, --role value) -> module: a role of a command whose flags live in another package
ROLES: dict[tuple[tuple[str, ...], str], str] = {
    (("agent",), "cache"): "ringseed.cache.command",
}


class CommandModule(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _usage(prefix: tuple[str, ...] = ()) -> str:
    """The command list (only the commands under ``prefix`` when one is given)."""
    name = " ".join(("ringseed", *prefix))
    lines = [f"usage: {name} COMMAND [ARGS...]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        if words[: len(prefix)] == prefix:
            lines.append(f"  {' '.join(words):<20} {help_text}")
    lines.append("")
    lines.append("Run 'ringseed COMMAND --help' for a command's options.")
    return "\n".join(lines)


def _groups() -> set[tuple[str, ...]]:
    """Words that only start commands (``local``), never a command by themselves."""
    return {words[:n] for words in COMMANDS for n in range(1, len(words))} - set(COMMANDS)


def _find(argv: Sequence[str]) -> tuple[tuple[str, ...], Sequence[str]] | None:
    for length in (2, 1):
        words = tuple(argv[:length])
        if words in COMMANDS:
            return words, argv[length:]
    return None


def _help_words(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] in ("-h", "--help", "help")


def _role(rest: Sequence[str]) -> str | None:
    for i, arg in enumerate(rest):
        if arg == "--role" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.startswith("--role="):
            return arg.split("=", 1)[1]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _help_words(argv):
        print(_usage())
        return 0
    if not argv:
        print(f"ringseed: give a command\n\n{_usage()}", file=sys.stderr)
        return 2
    if argv[0] == "--version":
        from ringseed import __version__

        print(__version__)
        return 0
    found = _find(argv)
    if found is None:
        return _not_a_command(argv)
    words, rest = found
    module, parser = command_parser(words, role=_role(rest))
    args = parser.parse_args(rest)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return module.run(args)
    except KeyboardInterrupt:
        return 130


def command_parser(words: tuple[str, ...], *, role: str | None = None) -> tuple[CommandModule, argparse.ArgumentParser]:
    """The module of command ``words`` (for ``--role role`` where a role has its own) and its parser."""
    module_name, help_text = COMMANDS[words]
    module_name = ROLES.get((words, role or ""), module_name)
    module: CommandModule = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(
        prog="ringseed " + " ".join(words),
        description=help_text,
        formatter_class=cmdline.HelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", type=_log_level, help="logging level of this process")
    module.configure(parser)
    return module, parser


def _not_a_command(argv: Sequence[str]) -> int:
    """``ringseed local`` (a group) lists its commands; anything else is an unknown command (2)."""
    for length in (2, 1):
        prefix = tuple(argv[:length])
        if prefix in _groups():
            tail = argv[length:]
            if _help_words(tail):
                print(_usage(prefix))
                return 0
            what = f"unknown command {' '.join(argv[: length + 1])!r}" if tail else "give a command"
            print(f"ringseed {' '.join(prefix)}: {what}\n\n{_usage(prefix)}", file=sys.stderr)
            return 2
    print(f"ringseed: unknown command {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
    return 2


def _log_level(text: str) -> int:
    level = logging.getLevelName(text.upper())
    if not isinstance(level, int):
        raise argparse.ArgumentTypeError(f"{text!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
    return level


if __name__ == "__main__":
    sys.exit(main())
