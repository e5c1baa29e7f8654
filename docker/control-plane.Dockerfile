# syntax=docker/dockerfile:1.7
#
# Control-plane image: gateway, router and scheduler in one small image.
# It never contains torch (DESIGN.md: "Control-plane services never import
# torch"); the role is chosen by the container's command, e.g.
#   python -m sluice.gateway | python -m sluice.router | python -m sluice.scheduler
#
# Build from the repository root (the context must be the repo):
#   docker build -f docker/control-plane.Dockerfile -t sluice/control-plane:0.1.0 .
# What it holds and how that is checked without a Docker daemon: docs/images.md.

# Pinned by tag (never latest); bump deliberately together with CI.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: a complete wheelhouse, locked by constraints.txt ---------------
FROM ${PYTHON_IMAGE} AS build
# The build backend of the local distributions. They are built without build
# isolation so that pip does not fetch whatever setuptools is newest into an
# isolated environment; this pin is the one the dev venv builds with.
ARG SETUPTOOLS_VERSION=84.2.1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install "setuptools==${SETUPTOOLS_VERSION}"
WORKDIR /src
COPY constraints.txt constraints.txt
# Every local distribution the three services and `sluice-rollout` need,
# transitively; all pure Python (sluice-engine, a router dependency, is the
# torch-free engine core; the model and kernels never come in; the rollout's
# torch extra, its quality runner, is not installed here).
COPY libs/outcomes libs/outcomes
COPY libs/telemetry libs/telemetry
COPY libs/rpc libs/rpc
COPY libs/config libs/config
COPY libs/tokenization libs/tokenization
COPY libs/engine libs/engine
COPY libs/admission libs/admission
COPY libs/placement libs/placement
COPY libs/limits libs/limits
COPY libs/ledger libs/ledger
COPY libs/rollout libs/rollout
COPY services/gateway services/gateway
COPY services/router services/router
COPY services/scheduler services/scheduler
# 1. The repository's own distributions, from these folders and nothing else:
#    --no-deps, so no resolver runs and no index is asked.
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels/local \
        ./libs/outcomes ./libs/telemetry ./libs/rpc ./libs/config ./libs/tokenization ./libs/engine \
        ./libs/admission ./libs/placement ./libs/limits ./libs/ledger ./libs/rollout \
        ./services/gateway ./services/router ./services/scheduler
# 2. Their third-party dependencies at the versions constraints.txt locks.
#    The local wheels are named as files, so pip takes every sluice-* it needs
#    from them and never looks one up on the index. A local distribution left
#    out of step 1 would be looked up there instead (a name anyone could
#    register), so the build refuses any sluice-* wheel step 1 did not build;
#    tests/deploy/test_image_install_sets.py finds such a gap before any build.
RUN pip wheel --wheel-dir /wheels/all -c constraints.txt /wheels/local/*.whl \
    && for wheel in /wheels/all/sluice_*.whl; do \
           test -e "/wheels/local/${wheel##*/}" \
               || { echo "${wheel##*/} was not built from this repository" >&2; exit 1; }; \
       done

# ---- runtime ---------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# From the build stage's wheelhouse only (--no-index): nothing is resolved
# against an index here, and the wheels do not stay in a layer.
RUN --mount=type=bind,from=build,source=/wheels/all,target=/wheels \
    pip install --no-index --find-links /wheels \
        sluice-outcomes sluice-telemetry sluice-rpc sluice-config sluice-tokenization sluice-engine \
        sluice-admission sluice-placement sluice-limits sluice-ledger sluice-rollout \
        sluice-gateway sluice-router sluice-scheduler \
    && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch leaked into the control-plane image'"
# Non-root; the numeric uid matches runAsUser in the Helm chart.
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/sluice --create-home sluice
USER 10001:10001
WORKDIR /home/sluice
# 8000 gateway HTTP, 50051 router gRPC, 50052 scheduler gRPC, 9090 metrics.
EXPOSE 8000 50051 50052 9090
CMD ["python", "-m", "sluice.gateway"]
