"""Child process of the listener tests: one collective Listener in a process whose limits the test sets.

Prints ``{"port": ..., "pid": ...}`` once listening, then answers one JSON line per stdin line:
``stats`` (the listener's counters and the data connections handed over), ``thread`` (whether a new
thread can start here: proves a pids limit bites), ``nofile N`` (lower the soft limit of open
files to N more than are open now). EOF on stdin ends it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import socket
import sys
import threading

from ringseed.collective import listener
from ringseed.protocol import frames

TOKEN = "test-token"


def main() -> None:
    kept: list[socket.socket] = []

    def keep(hello: frames.Hello, sock: socket.socket) -> None:
        kept.append(sock)

    lis = listener.Listener(
        host="127.0.0.1", port=0, token=TOKEN, io_timeout=30, on_link=keep, handshake_timeout=float(sys.argv[1])
    )
    lis.start()
    print(json.dumps({"port": lis.port, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "stats":
            answer: dict[str, object] = {**dataclasses.asdict(lis.stats), "kept": len(kept)}
        elif command[0] == "thread":
            answer = {"started": _can_start_a_thread()}
        elif command[0] == "nofile":
            open_now = len(os.listdir("/proc/self/fd"))
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + int(command[1]), hard))
            answer = {"limit": open_now + int(command[1])}
        else:
            answer = {"error": f"unknown command {command[0]!r}"}
        print(json.dumps(answer), flush=True)
    lis.close()


def _can_start_a_thread() -> bool:
    try:
        thread = threading.Thread(target=lambda: None)
        thread.start()
    except RuntimeError:
        return False
    thread.join()
    return True


if __name__ == "__main__":
    main()
