#!/usr/bin/env bash
# The checks to run when a GPU is at hand, as one short script (a lent GPU
# is counted in minutes): the Triton kernels' tests compiled and run on the
# GPU, the simulator's GPU cost model against real engine steps, and the
# decode kernel's achieved HBM bandwidth. It needs a python3 with torch
# (CUDA), triton, pytest, pytest-timeout, hypothesis and safetensors; the
# project's packages are taken from the checkout, not installed. Each part
# has its own time limit, so one that hangs leaves the others' figures.
# Logs go to $OUT (default ./gpu-out).
#
#   bash bench/gpu_session.sh        # ~6-8 minutes on an H200
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
PYTHONPATH=$(ls -d "$PWD"/libs/*/src "$PWD"/services/*/src | paste -sd:)
export PYTHONPATH PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
$python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 \
    | tee -a "$out/gpu.txt"

echo "== Triton kernel tests on the GPU"
timeout "${KERNEL_TESTS_S:-200}" $python -m pytest tests/unit/kernels/test_triton_paged_attention.py -q \
    -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning 2>&1 | tee "$out/kernel_tests.log"
echo "== the simulator's GPU cost model against real engine steps"
timeout "${SIM_S:-220}" $python bench/bench_sim_gpu_fidelity.py --json "$out/sim_gpu.json" 2>&1 \
    | tee "$out/sim_gpu.log"
echo "== decode kernel bandwidth"
timeout "${DECODE_S:-140}" $python bench/bench_decode_kernel_gpu.py --iters 30 2>&1 | tee "$out/decode_kernel.log"
echo "== done"
