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
if [ "$(id -u)" -eq 0 ]; then
  # The e2e tests run the image (tests/e2e/test_image.py, test_deployed.py); build it here, outside
  # pytest's per-test timeout (cached: seconds when nothing changed, minutes on a new machine).
  echo "== image (hack/image.sh)"; bash hack/image.sh
fi
echo "== pytest"; pytest "$@"
