#!/usr/bin/env bash
# Create .venv and install ringseed with its dev and torch extras.
# torch is pinned to 2.13.0 first: on these machines that is a CPU wheel on disk; an unpinned
# torch would pull a multi-GB CUDA build. Set RINGSEED_NO_TORCH=1 to skip torch entirely.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
extras="dev"
if [ "${RINGSEED_NO_TORCH:-0}" != "1" ]; then
  .venv/bin/python -m pip install -q "torch==${RINGSEED_TORCH_VERSION:-2.13.0}"
  extras="dev,torch"
fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
bash hack/install-helm.sh
echo "ringseed set up in .venv (extras: ${extras})"
