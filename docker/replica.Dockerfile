# syntax=docker/dockerfile:1.7
#
# Replica image: the GPU data plane (CUDA torch, Triton kernels, the native
# CPU kernels, model, engine), and `sluice rollout` with its quality extra:
# the chart's rollout Job runs here, since its quality check loads both
# versions' weights with torch and the model code.
#
# Build from the repository root (the context must be the repo):
#   docker build -f docker/replica.Dockerfile -t sluice/replica:0.1.0 .
# What it holds and how that is checked without a Docker daemon: docs/images.md.
#
# The torch wheel from PyPI for Linux x86_64 is the CUDA build: it brings its
# CUDA user-space libraries as nvidia-* wheels and the Triton it was built
# with, all pinned exactly by torch's own metadata. The base image therefore
# only needs to be a CUDA "base" flavour (it sets what the NVIDIA container
# runtime reads to mount the driver) whose driver requirement the nodes meet.

# Pinned by tag (never latest).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04

# ---- python: interpreter and C toolchain, shared by build and runtime -------
FROM ${CUDA_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
# Ubuntu 24.04 ships Python 3.12 (the services need >= 3.11); its system
# Python is externally managed, hence the venv. gcc, libc6-dev and
# python3-dev stay in the runtime image on purpose: Triton compiles a small
# C launcher (against the Python headers) the first time each kernel runs,
# so a replica without a C compiler cannot launch its CUDA kernels. The build
# stage compiles the native CPU kernels with the same toolchain.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# ---- build: a complete wheelhouse, locked by constraints.txt ---------------
FROM python AS build
# The torch release the replica is tested against (the Makefile's pin);
# constraints.txt leaves torch out because the dev venv has the CPU build.
ARG TORCH_VERSION=2.13.0
# The build backend of the local distributions, and the setuptools torch
# requires at run time; built without build isolation so that pip does not
# fetch whatever setuptools is newest. The one the dev venv builds with.
ARG SETUPTOOLS_VERSION=84.2.1
RUN pip install "setuptools==${SETUPTOOLS_VERSION}"
WORKDIR /src
COPY constraints.txt constraints.txt
# torch and its CUDA libraries first, in their own layer: by far the largest
# and the part that changes least.
RUN pip wheel --wheel-dir /wheels/torch -c constraints.txt \
        "torch==${TORCH_VERSION}" "setuptools==${SETUPTOOLS_VERSION}"
# Every local distribution the replica and `sluice-rollout[quality]` need,
# transitively (the rollout's quality runner reads tokenizers through
# sluice-tokenization).
COPY libs/outcomes libs/outcomes
COPY libs/telemetry libs/telemetry
COPY libs/rpc libs/rpc
COPY libs/config libs/config
COPY libs/tokenization libs/tokenization
COPY libs/engine libs/engine
COPY libs/kernels libs/kernels
COPY libs/model libs/model
COPY libs/rollout libs/rollout
COPY services/replica services/replica
# 1. The repository's own distributions, from these folders and nothing else
#    (--no-deps: no resolver, no index). sluice-kernels compiles its native
#    CPU kernels here; they are optional in setup.py, so a failed compile
#    would pass silently: the check after it makes that a build error.
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels/local \
        ./libs/outcomes ./libs/telemetry ./libs/rpc ./libs/config ./libs/tokenization ./libs/engine \
        ./libs/kernels ./libs/model ./libs/rollout ./services/replica \
    && python -c "import glob, zipfile; \
names = zipfile.ZipFile(glob.glob('/wheels/local/sluice_kernels-*.whl')[0]).namelist(); \
missing = [k for k in ('_paged_attention_cpu', '_argmax_cpu', '_elementwise_cpu') if not any(k in n and n.endswith('.so') for n in names)]; \
assert not missing, f'native CPU kernels not compiled: {missing}'"
# 2. Their third-party dependencies at the versions constraints.txt locks,
#    with the Triton extra of the kernels and the quality extra of the
#    rollout. The local wheels are named as files, so pip takes every
#    sluice-* it needs from them and never looks one up on the index; a
#    local distribution left out of step 1 would be looked up there instead,
#    so the build refuses any sluice-* wheel that step 1 did not build
#    (tests/deploy/test_image_install_sets.py finds such a gap before any
#    build).
RUN pip wheel --wheel-dir /wheels/all --find-links /wheels/torch -c constraints.txt \
        "torch==${TORCH_VERSION}" "setuptools==${SETUPTOOLS_VERSION}" \
        "sluice-kernels[triton]" "sluice-rollout[quality]" /wheels/local/*.whl \
    && for wheel in /wheels/all/sluice_*.whl; do \
           test -e "/wheels/local/${wheel##*/}" \
               || { echo "${wheel##*/} was not built from this repository" >&2; exit 1; }; \
       done

# ---- runtime ---------------------------------------------------------------
FROM python
ARG TORCH_VERSION=2.13.0
# From the build stage's wheelhouses only (--no-index): nothing is resolved
# against an index here, and the wheels do not stay in a layer. torch first,
# so its multi-GB layer survives changes to the repository's code.
RUN --mount=type=bind,from=build,source=/wheels/torch,target=/wheels \
    pip install --no-index --find-links /wheels "torch==${TORCH_VERSION}"
RUN --mount=type=bind,from=build,source=/wheels/all,target=/wheels \
    pip install --no-index --find-links /wheels \
        sluice-outcomes sluice-telemetry sluice-rpc sluice-config sluice-tokenization sluice-engine \
        "sluice-kernels[triton]" sluice-model "sluice-rollout[quality]" sluice-replica
# Non-root; the numeric uid matches runAsUser in the Helm chart.
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/sluice --create-home sluice
USER 10001:10001
WORKDIR /home/sluice
# 50061 replica gRPC, 9090 metrics.
EXPOSE 50061 9090
CMD ["python", "-m", "sluice.replica"]
