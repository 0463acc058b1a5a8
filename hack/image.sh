#!/usr/bin/env bash
# Build ringseed's image with podman: the default target (operator, master, agent) and the
# `training` target (plus torch). Idempotent and cached: a second run with an unchanged tree takes
# seconds; a source change rebuilds only the layers after the dependencies.
#
# Base image: where `python:3.11-slim` cannot be pulled (no registry reachable, as on the build
# machines), a stand-in is built once per machine from Debian's archive with debootstrap
# (bookworm's Python 3.11 plus pip, venv, passwd and ca-certificates, and this machine's
# proxy CAs from /usr/local/share/ca-certificates so pip inside the build trusts the proxy) and
# imported under that name; podman's store keeps it, labelled with a hash of its recipe, so a
# changed recipe or CA rebuilds it and a new machine builds it. Such a base is for tests only.
# An existing python:3.11-slim without that label (a real one) is used as it is.
#
# Torch: from a local wheel directory (TORCH_WHEELS, default /opt/wheels, where the set-up
# script's pip finds torch on these machines) when it holds torch-$TORCH_VERSION+cpu, with no
# torch index (the PyTorch CPU index is not reachable here); otherwise from the Dockerfile's
# default index. Torch's dependencies come from PyPI.
#
# Env: IMAGE (default ringseed:dev), TRAINING_IMAGE (ringseed:dev-training),
#      TARGETS ("runtime training"), TORCH_VERSION (2.13.0), TORCH_WHEELS (/opt/wheels),
#      DEBIAN_MIRROR (http://deb.debian.org/debian), REFRESH_PINS (1; 0 keeps hack/image-requirements.txt
#      as committed). TARGETS="" builds only the base. Prints each image's size at the end.
# One build at a time per machine (a lock): a second run waits, then finds the images up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-ringseed:dev}
TRAINING_IMAGE=${TRAINING_IMAGE:-ringseed:dev-training}
TARGETS=${TARGETS-runtime training}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=docker.io/library/python:3.11-slim
STANDIN_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,passwd,ca-certificates
REFRESH_PINS=${REFRESH_PINS:-1}
podman=(bash hack/podman.sh)
started=$SECONDS
exec 9>/var/tmp/ringseed-image.lock
if ! flock -n 9; then
  echo "== another hack/image.sh runs on this machine; waiting for it"
  flock 9
fi

need_tools() {
  local missing=()
  for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "image: ${missing[*]} missing; install podman, runc and debootstrap (root and apt-get needed here)" >&2
    exit 2
  fi
  echo "== installing ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
}

standin_recipe() {  # what the stand-in is made of: a change rebuilds it
  { echo "bookworm minbase $STANDIN_PACKAGES"; cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true; } \
    | sha256sum | cut -c1-16
}

ensure_base() {
  local want have
  want=$(standin_recipe)
  if have=$("${podman[@]}" image inspect --format '{{index .Labels "io.ringseed.standin"}}' "$BASE" 2>/dev/null); then
    if [ "$have" = "<no value>" ] || [ -z "$have" ]; then echo "== base $BASE (not a stand-in; used as it is)"; return; fi
    if [ "$have" = "$want" ]; then echo "== base $BASE (stand-in $want, cached)"; return; fi
    echo "== base $BASE: stand-in $have is out of date (recipe $want); rebuilding"
  else
    echo "== base $BASE absent; building a stand-in from Debian's archive (a few minutes, once per machine)"
  fi
  local rootfs
  rootfs=$(mktemp -d /var/tmp/ringseed-standin.XXXXXX)
  trap 'rm -rf "$rootfs"' RETURN
  debootstrap --variant=minbase --include="$STANDIN_PACKAGES" bookworm "$rootfs" "$DEBIAN_MIRROR" >/dev/null
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
  tar -C "$rootfs" -c . | "${podman[@]}" import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    --change "LABEL io.ringseed.standin=$want" - "$BASE" >/dev/null
}

inputs_hash() {  # everything the build reads, and how it is asked for: an equal hash means an equal image
  {
    printf '%s\n' "$@"
    "${podman[@]}" image inspect --format '{{.Id}}' "$BASE"
    find Dockerfile .dockerignore pyproject.toml README.md hack/image-requirements.txt hack/image-torch-constraints.txt ringseed \
      -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
}

build() {  # target tag [podman build args...]
  local target=$1 tag=$2 t0=$SECONDS want have
  shift 2
  want=$(inputs_hash "$target" "$@")
  have=$("${podman[@]}" image inspect --format '{{index .Labels "io.ringseed.inputs"}}' "$tag" 2>/dev/null || true)
  if [ "$have" = "$want" ]; then echo "== $tag is up to date (inputs $want)"; return; fi
  echo "== podman build --target $target -t $tag"
  "${podman[@]}" build --pull=never --layers --target "$target" -t "$tag" --label "io.ringseed.inputs=$want" "$@" .
  echo "== $tag built in $((SECONDS - t0)) s"
}

need_tools
if [ "$REFRESH_PINS" = 1 ] && [ -x .venv/bin/python ]; then
  # The pins are the versions the tests run with: refresh them from the set-up venv, so a
  # dependency someone added to pyproject.toml reaches the image without a manual step.
  bash hack/lock-image-deps.sh >/dev/null
fi
ensure_base
for target in $TARGETS; do
  case $target in
    runtime) build runtime "$IMAGE" ;;
    training)
      wheels=$TORCH_WHEELS
      if [ ! -d "$wheels" ]; then wheels=$(mktemp -d); trap 'rmdir "$wheels"' EXIT; fi
      args=(--build-context "torch-wheels=$wheels")
      if compgen -G "$TORCH_WHEELS/torch-$TORCH_VERSION+cpu-*.whl" >/dev/null; then
        args+=(--build-arg "TORCH_VERSION=$TORCH_VERSION+cpu" --build-arg TORCH_INDEX_URL=)
      else
        echo "== no torch-$TORCH_VERSION+cpu wheel in $TORCH_WHEELS; using the Dockerfile's torch index"
        args+=(--build-arg "TORCH_VERSION=$TORCH_VERSION+cpu")
      fi
      build training "$TRAINING_IMAGE" "${args[@]}" ;;
    *) echo "image: unknown target $target (runtime, training)" >&2; exit 2 ;;
  esac
done
for tag in "$IMAGE" "$TRAINING_IMAGE"; do
  [ -n "$TARGETS" ] || break
  size=$("${podman[@]}" image inspect --format '{{.Size}}' "$tag" 2>/dev/null) || continue
  echo "image: $tag $((size / 1000000)) MB"
done
echo "image: done in $((SECONDS - started)) s"
