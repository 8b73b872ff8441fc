#!/usr/bin/env bash
# The GPU check of issue 5, for whenever a CUDA GPU is at hand (a few minutes on one H100/H200):
# `medium`, both stacks interleaved on 1 GPU, MFU against the datasheet dense bf16 peak, plus the
# FLOP cross-check. Writes results/runs/gpu-check-*.json and prints the tables.
#
#   scripts/setup.sh --gpu && scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
export PYTHONUNBUFFERED=1
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print(torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
"$py" -m gembench describe --config medium
"$py" -m gembench run --config medium --device cuda --stack optimized --steps 20 --warmup 5 \
  --out "results/runs/gpu-check-optimized-$(date +%s).json"
"$py" -m gembench run --config medium --device cuda --ab --rounds 4 --steps 8 --warmup 3 \
  --out "results/runs/gpu-check-ab-$(date +%s).json"
