# syntax=docker/dockerfile:1.7
#
# Replica image: the GPU data plane (torch, Triton kernels, model, engine).
#
# Build from the repository root (the context must be the repo):
#   docker build -f docker/replica.Dockerfile -t sluice/replica:0.1.0 .
#
# The torch wheel from PyPI bundles its CUDA user-space libraries (the
# nvidia-* wheels), so the base image only needs to be a CUDA 12 "base"
# flavour whose driver compatibility matches the nodes. Triton compiles a
# small C launcher at run time, hence gcc and the Python headers.

# Pinned by tag (never latest).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
# The torch release the replica is tested against; pinned so images are
# reproducible. Keep in step with the project's test environment.
ARG TORCH_VERSION=2.13.0

FROM ${CUDA_IMAGE}
ARG TORCH_VERSION
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
# Ubuntu 24.04 ships Python 3.12 (the services need >= 3.11).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
# torch first, in its own layer: it is by far the largest and changes least.
RUN pip install "torch==${TORCH_VERSION}"
WORKDIR /src
COPY libs/kernels libs/kernels
COPY libs/model libs/model
COPY libs/engine libs/engine
COPY libs/outcomes libs/outcomes
COPY libs/telemetry libs/telemetry
COPY libs/rpc libs/rpc
COPY libs/config libs/config
COPY services/replica services/replica
# sluice-rpc needs sluice-outcomes (the reasons every hop shares).
RUN pip install \
        ./libs/kernels ./libs/model ./libs/engine ./libs/outcomes ./libs/telemetry ./libs/rpc ./libs/config ./services/replica \
    && rm -rf /src
# Non-root; the numeric uid matches runAsUser in the Helm chart.
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/sluice --create-home sluice
USER 10001:10001
WORKDIR /home/sluice
# 50061 replica gRPC, 9090 metrics.
EXPOSE 50061 9090
CMD ["python", "-m", "sluice.replica"]
