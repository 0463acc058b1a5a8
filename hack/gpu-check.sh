#!/usr/bin/env bash
# The CUDA checks of the collective data plane and the torch backend, for a machine with a GPU and
# only python3, torch, numpy and pytest installed (no venv, no network, nothing built):
#   bash hack/gpu-check.sh            # extra pytest arguments pass through, e.g. -x -v
# Runs tests/component/collective/test_cuda.py: CUDA tensors (non-contiguous, float32, bfloat16,
# float16, int64) all-reduced on 3 engines with the reduction on the GPU, and every collective of
# the ringseed torch backend on CUDA tensors across 3 processes.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
PYTHONPATH=. exec python3 -m pytest -q -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning \
  tests/component/collective/test_cuda.py "$@"
