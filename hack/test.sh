#!/usr/bin/env bash
# Set up (idempotent) and run every check CI runs: ruff, mypy --strict, import contracts, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
export PATH="$PWD/.tools/bin:$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check ringseed tests bench; ruff format --check ringseed tests bench
echo "== mypy --strict"; mypy
echo "== import contracts"; lint-imports
echo "== chart CRDs match crds/"; bash hack/verify-crds.sh
echo "== pytest"; pytest "$@"
