#!/usr/bin/env bash
# PyTorch's own distributed suite (torch/testing/_internal/distributed/distributed_test.py) against
# ringseed and Gloo, world sizes 2, 3 and 8, CPU; with Gloo's test selection for both, so that every
# test Gloo passes must pass with ringseed. About 10 minutes for all three world sizes on the 2 shared
# cores (2026-12-01, BENCHMARKS section 5; run it under nice -n 19 there): not part of CI.
#   bash hack/torch-suite.sh [WORLD ...]        results in ${OUT:-/tmp/torchsuite}/
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/torchsuite}
mkdir -p "$out"
for world in "${@:-2 3 8}"; do
  for backend in gloo ringseed; do
    .venv/bin/python -m tests.torchsuite run --backend "$backend" --select gloo --world "$world" \
      --junit "$out/$backend-$world.xml" | tee -a "$out/summary.jsonl" || true
  done
  .venv/bin/python -m tests.torchsuite compare "$out/gloo-$world.xml" "$out/ringseed-$world.xml" \
    | tee -a "$out/compare.jsonl" || true
done
