# syntax=docker/dockerfile:1.7
# ringseed image: operator, master, agent and the workers' runtime copy (pure Python).
#
#   docker build -t ringseed:dev .                      # default target "runtime": no torch
#   docker build -t ringseed:dev-torch --target training .   # adds torch (CPU wheel) for training images
#
# Both run as uid 10001 (the uid the operator's pods use) with entrypoint `ringseed`.
# Written without a Docker engine at hand (none on the build machines): hack/kind-e2e.sh builds it.

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0

FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# Build a virtual environment holding ringseed and its dependencies only.
FROM base AS build
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ringseed ./ringseed
RUN pip install --no-compile . \
 && find /opt/venv -name '__pycache__' -type d -prune -exec rm -rf {} + \
 && ringseed --version

FROM build AS build-torch
ARG TORCH_VERSION
RUN pip install --no-compile "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu

# Training target: ringseed plus torch, a base for training images.
FROM base AS training
COPY --from=build-torch /opt/venv /opt/venv
RUN groupadd --system --gid 10001 ringseed \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin ringseed
USER 10001:10001
ENTRYPOINT ["ringseed"]
CMD ["--help"]

# Default target (last stage): no torch, kept small for operator, master and agent.
FROM base AS runtime
COPY --from=build /opt/venv /opt/venv
RUN groupadd --system --gid 10001 ringseed \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin ringseed
USER 10001:10001
EXPOSE 8470 8471 8472
ENTRYPOINT ["ringseed"]
CMD ["--help"]
