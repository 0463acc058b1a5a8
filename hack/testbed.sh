#!/usr/bin/env bash
# Network-namespace testbed (needs root): an origin host and N node hosts on a bridge,
# each link limited with tc tbf in both directions.
#   hack/testbed.sh up [--nodes 3] [--origin-rate 100mbit] [--node-rate 1gbit]   # leave it standing
#   hack/testbed.sh down                                                          # remove it
#   hack/testbed.sh status
#   hack/testbed.sh run [--nodes N ...] -- CMD ARGS...   # testbed for CMD's lifetime (RSTB_* env)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" -m ringseed.testbed.command "$@"
