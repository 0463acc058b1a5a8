"""Run PyTorch's distributed suite (``upstream.py``) for one backend and world size; compare runs.

    .venv/bin/python -m tests.torchsuite run --backend ringseed --world 2 [--select gloo] [-k EXPR]
    .venv/bin/python -m tests.torchsuite compare GLOO.xml RINGSEED.xml

``run`` prints one JSON line (backend, selection, world, passed, failed, skipped, errors, seconds,
junit path) and exits 0 when nothing failed. ``compare`` lists the tests that pass with the first
run and not with the second (the target: none). The whole suite at world sizes 2, 3 and 8 is
``hack/torch-suite.sh``; CI runs a fast subset (``tests/component/collective/test_torch_suite.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def outcomes(junit: Path) -> dict[str, str]:
    """test name -> passed | failed | skipped | error."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        state = (
            "failed"
            if "failure" in kinds
            else "error"
            if "error" in kinds
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        result[case.get("name", "?")] = state
    return result


def run(
    *, backend: str, select: str, world: int, keyword: str | None, junit: Path, timeout: float
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="torchsuite-") as temp:
        (Path(temp) / "barrier").mkdir()
        env = {
            **os.environ,
            "BACKEND": select,
            "WORLD_SIZE": str(world),
            "TEMP_DIR": temp,
            "RINGSEED_SUITE_BACKEND": backend,
            "RINGSEED_SUITE_SELECT": select,
            "PYTHONWARNINGS": "ignore",
        }
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "addopts=",
            "--timeout",
            "600",
            str(REPO / "tests" / "torchsuite" / "upstream.py"),
            "--junitxml",
            str(junit),
            *(["-k", keyword] if keyword else []),
        ]
        start = time.monotonic()
        subprocess.run(command, cwd=REPO, env=env, timeout=timeout, check=False, stdout=subprocess.DEVNULL)
        seconds = time.monotonic() - start
    states = outcomes(junit)
    counts = {s: sum(v == s for v in states.values()) for s in ("passed", "failed", "skipped", "error")}
    return {
        "backend": backend,
        "select": select,
        "world": world,
        **counts,
        "seconds": round(seconds),
        "junit": str(junit),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torchsuite", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the suite for one backend and world size")
    r.add_argument("--backend", default="ringseed", choices=["ringseed", "gloo"])
    r.add_argument(
        "--select",
        default=None,
        choices=["ringseed", "gloo"],
        help="whose skip decorators decide (default: the backend)",
    )
    r.add_argument("--world", type=int, default=2)
    r.add_argument("-k", dest="keyword", default=None, help="pytest -k expression (a subset)")
    r.add_argument("--junit", type=Path, default=None)
    r.add_argument("--timeout", type=float, default=6 * 3600)
    c = sub.add_parser("compare", help="tests passing in the first run and not in the second")
    c.add_argument("baseline", type=Path)
    c.add_argument("candidate", type=Path)
    args = parser.parse_args()
    if args.command == "compare":
        base, cand = outcomes(args.baseline), outcomes(args.candidate)
        lost = sorted(t for t, s in base.items() if s == "passed" and cand.get(t) != "passed")
        print(json.dumps({"baseline_passed": sum(s == "passed" for s in base.values()), "not_passing": lost}))
        return 1 if lost else 0
    select = args.select or args.backend
    junit = args.junit or Path(tempfile.gettempdir()) / f"torchsuite-{args.backend}-{select}-{args.world}.xml"
    summary = run(
        backend=args.backend, select=select, world=args.world, keyword=args.keyword, junit=junit, timeout=args.timeout
    )
    print(json.dumps(summary))
    return 0 if summary["failed"] == 0 and summary["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
