#!/usr/bin/env bash
# Set up (idempotent) and run every check CI runs: ruff, mypy --strict, import contracts, pytest.
#
# As root the tests also run the project's image (tests marked `image`: tests/e2e/test_image.py,
# test_deployed.py). Its build (hack/image.sh: seconds when nothing changed, ~16 min on a new
# machine) runs in the background while the other checks and tests run: the stand-in base image
# while the venv is set up, the targets once it is. The `image` tests run last, after the build
# (its log is printed then). Arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=0
[ "$(id -u)" -eq 0 ] && root=1
if [ $root -eq 1 ]; then
  image_log=$(mktemp /var/tmp/ringseed-image-build.XXXXXX.log)
  # The base needs no venv (and the pins are not refreshed from a venv being set up); the full
  # build below waits for it (hack/image.sh takes a lock) and then finds it cached.
  (REFRESH_PINS=0 TARGETS="" bash hack/image.sh >"$image_log" 2>&1) &
fi
bash hack/setup.sh
export PATH="$PWD/.tools/bin:$PWD/.venv/bin:$PATH"
if [ $root -eq 1 ] && command -v apt-get >/dev/null \
   && ! { ldconfig -p | grep -q 'libfuse\.so\.2' && ldconfig -p | grep -q 'libfuse3\.so\.3'; }; then
  # the FUSE mount's tests (tests/component/cache/test_fuse.py) need libfuse 2 (fusepy loads it) and
  # libfuse 3 (the dataset mount's low-level server loads it with ctypes; fuse3 depends on it)
  echo "== installing libfuse2 fuse3 (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuse2 fuse3 >/dev/null; } \
    || echo "libfuse2/fuse3 could not be installed: the FUSE tests will skip, naming it" >&2
fi
if [ $root -eq 1 ]; then
  # no `wait $base_job` here: the subshell is not its parent (bash: "not a child of this shell");
  # hack/image.sh's lock makes this build wait for the base build instead
  (bash hack/image.sh >>"$image_log" 2>&1) &
  image_job=$!
  trap 'kill $image_job 2>/dev/null || true' EXIT
  echo "== image: building in the background (hack/image.sh, log $image_log)"
fi
echo "== ruff"; ruff check ringseed tests bench; ruff format --check ringseed tests bench
echo "== mypy --strict"; mypy
echo "== import contracts"; lint-imports
echo "== chart CRDs match crds/"; bash hack/verify-crds.sh
pytest_run() {  # pytest, where "no tests collected" (the arguments chose none of this run) is fine
  local rc=0
  pytest "$@" || rc=$?
  [ $rc -eq 5 ] && rc=0
  return $rc
}
if [ $root -eq 0 ]; then
  echo "== pytest"; pytest "$@"
  exit
fi
failed=0
echo "== pytest (all but the image's tests, while the image builds)"
pytest_run -m "not image" "$@" || failed=1
echo "== image (hack/image.sh, waiting for the background build)"
image_rc=0
wait $image_job || image_rc=$?
trap - EXIT
grep -E '^(== |image: )' "$image_log" || true
if [ $image_rc -ne 0 ]; then
  tail -n 60 "$image_log"
  echo "image: the build failed ($image_rc); log $image_log" >&2
  exit 1
fi
echo "== pytest (the image's tests)"
pytest_run -m image "$@" || failed=1
exit $failed
