# syntax=docker/dockerfile:1.7
#
# Control-plane image: gateway, router and scheduler in one small image.
# It never contains torch (DESIGN.md: "Control-plane services never import
# torch"); the role is chosen by the container's command, e.g.
#   python -m sluice.gateway | python -m sluice.router | python -m sluice.scheduler
#
# Build from the repository root (the context must be the repo):
#   docker build -f docker/control-plane.Dockerfile -t sluice/control-plane:0.1.0 .

# Pinned by tag (never latest); bump deliberately together with CI.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: wheels for the distributions the three services need -----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Every local distribution the three services need, transitively; all pure
# Python (sluice-engine, a router dependency, is the torch-free engine core;
# the model and kernels never come in).
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
COPY services/gateway services/gateway
COPY services/router services/router
COPY services/scheduler services/scheduler
# One resolver run over all local distributions, so `sluice-rpc` etc. are
# satisfied by the local paths and third-party wheels come from the index.
RUN pip wheel --wheel-dir /wheels \
        ./libs/outcomes ./libs/telemetry ./libs/rpc ./libs/config ./libs/tokenization ./libs/engine \
        ./libs/admission ./libs/placement ./libs/limits ./libs/ledger \
        ./services/gateway ./services/router ./services/scheduler

# ---- runtime ---------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels \
        sluice-outcomes sluice-telemetry sluice-rpc sluice-config sluice-tokenization sluice-engine \
        sluice-admission sluice-placement sluice-limits sluice-ledger \
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
