# syntax=docker/dockerfile:1.7
# ringseed image: operator, master, agent and the workers' runtime copy (pure Python).
#
#   docker build -t ringseed:dev .                               # default target "runtime": no torch
#   docker build -t ringseed:dev-training --target training .    # adds torch (CPU wheel)
#
# Both run as uid 10001 (the uid the operator's pods use) with entrypoint `ringseed`, and work
# with a read-only root filesystem and no capabilities (the chart's pods ask for both).
#
# Where torch comes from (training target): pip looks in the build context `torch-wheels` first
# (empty unless given: `--build-context torch-wheels=DIR`, docker buildx or podman), then in
# TORCH_INDEX_URL (the PyTorch CPU index by default; empty: none) beside PyPI for its
# dependencies. TORCH_VERSION pins the build: "2.13.0+cpu" exists only as a CPU wheel, so pip
# can never pick PyPI's CUDA build of the same version. hack/image.sh builds both targets with
# podman where no registry can be reached (a local wheel directory, no index).
#
# Layers: dependencies (pinned in hack/image-requirements.txt) and torch come before the source, so a source
# change rebuilds only the last small layers.

ARG PYTHON_VERSION=3.11

# Local torch wheels, empty unless the build is given a directory under this name.
FROM scratch AS torch-wheels

FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# libfuse 2 (fusepy loads it), libfuse 3 (fuse3 depends on libfuse3-3: the dataset mount's low-level
# server loads it with ctypes) and fusermount (fuse3 provides it): a TrainingGroup's data-mount
# sidecar runs `ringseed mount` from this image, and its preStop hook `fusermount -u`.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libfuse2 fuse3 >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*

# The virtual environment with ringseed's dependencies only, pinned (hack/image-requirements.txt,
# written by hack/lock-image-deps.sh from the versions the tests ran with); this layer depends on
# that file alone. `pip check` in the build stages catches a pyproject.toml ahead of the pins.
FROM base AS deps
RUN python -m venv /opt/venv
WORKDIR /src
COPY hack/image-requirements.txt ./
RUN pip install --no-compile -r image-requirements.txt \
 && python -m compileall -q -j 0 /opt/venv

FROM deps AS deps-torch
ARG TORCH_VERSION=2.13.0+cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY hack/image-torch-constraints.txt ./
RUN --mount=type=bind,from=torch-wheels,target=/wheels \
    pip install --no-compile -c image-torch-constraints.txt --find-links /wheels \
      ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}" \
 && python -m compileall -q -j 0 -x '/torch/testing/_internal/' /opt/venv  # Python 3.12-only test helpers there

# ringseed itself as a wheel, built once for both targets (build tools stay in this stage).
FROM base AS wheel
RUN python -m venv /opt/buildtools && /opt/buildtools/bin/pip install --no-compile "setuptools>=68" wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ringseed ./ringseed
RUN /opt/buildtools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist .

# Compiled bytecode ships in the image (dependencies compiled in their own layers above): with a
# read-only root filesystem Python could never cache it, and every start of a process would
# compile kopf and the kubernetes client again. The targets build on these stages directly (no
# copy of the venv into a fresh stage: that copy alone took minutes for torch's gigabyte).
FROM deps AS build
COPY --from=wheel /dist /dist
RUN pip install --no-deps --no-compile /dist/*.whl \
 && pip check \
 && python -c "import compileall, os, ringseed, sys; sys.exit(not compileall.compile_dir(os.path.dirname(ringseed.__file__), quiet=1))" \
 && ringseed --version \
 && groupadd --system --gid 10001 ringseed \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin ringseed

# Training target: ringseed plus torch, a base for training images.
FROM deps-torch AS training
COPY --from=wheel /dist /dist
RUN pip install --no-deps --no-compile /dist/*.whl \
 && pip check \
 && python -c "import compileall, os, ringseed, sys; sys.exit(not compileall.compile_dir(os.path.dirname(ringseed.__file__), quiet=1))" \
 && ringseed --version \
 && python -c "import torch, ringseed.collective.torch_backend; print('torch', torch.__version__)" \
 && groupadd --system --gid 10001 ringseed \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin ringseed
WORKDIR /
USER 10001:10001
ENTRYPOINT ["ringseed"]
CMD ["--help"]

# Default target (last stage): no torch, kept small for operator, master and agent.
FROM build AS runtime
WORKDIR /
USER 10001:10001
EXPOSE 8470 8471 8472
ENTRYPOINT ["ringseed"]
CMD ["--help"]
