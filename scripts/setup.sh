#!/usr/bin/env bash
# Creates .venv and installs gembench with its pinned stack.
#
#   scripts/setup.sh          CPU: torch 2.13.0 (CPU build) + fbgemm-gpu-cpu 1.8.0 + torchrec 1.8.0
#   scripts/setup.sh --gpu    CUDA: torch 2.13.0 + fbgemm-gpu 1.8.0 from the PyTorch CUDA index
#                             (set TORCH_INDEX_URL to pick the CUDA version, default cu128)
#   scripts/setup.sh --browser  only Debian's chromium and chromium-driver (apt, as root), for the
#                             report's browser test
#
# Safe to run again: it reuses .venv and installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=0
[ "${1:-}" = "--gpu" ] && gpu=1
if [ "${1:-}" = "--browser" ]; then
  # tests/test_report_browser.py opens `gembench report` pages in headless Chromium through Selenium
  # and Debian's chromedriver (no driver is downloaded at run time); it skips without either
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "chromium present: $(command -v chromium), driver $(command -v chromedriver)"
    exit 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh --browser: needs root and apt-get; install chromium and chromium-driver yourself (or set GEMBENCH_CHROMIUM and GEMBENCH_CHROMEDRIVER)" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
  exit $?
fi
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip -q --disable-pip-version-check)
constraints=scripts/constraints.txt

if [ "$gpu" = 1 ]; then
  index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}
  "${pip[@]}" install --index-url "$index" --extra-index-url https://pypi.org/simple \
    torch==2.13.0 fbgemm-gpu==1.8.0
  # CUDA torch brings the Triton it was built with: the CPU pins of fbgemm and triton stay out.
  gpu_constraints=$(mktemp)
  grep -v -e fbgemm-gpu-cpu -e '^triton' "$constraints" > "$gpu_constraints"
  constraints=$gpu_constraints
  "${pip[@]}" install torchrec==1.8.0 -c "$constraints"
else
  "${pip[@]}" install -c "$constraints" torch==2.13.0 fbgemm-gpu-cpu==1.8.0
  # torchrec's metadata requires the CUDA `fbgemm-gpu` (~500 MB); on CPU, fbgemm-gpu-cpu
  # provides the same module, so torchrec goes in without its declared deps, which follow.
  "${pip[@]}" install -c "$constraints" --no-deps torchrec==1.8.0
  "${pip[@]}" install -c "$constraints" tensordict torchmetrics pyre-extensions tqdm
  # Triton's interpreter runs the GPU attention kernels' tests on CPU tensors (tests/test_hstu_triton.py).
  "${pip[@]}" install -c "$constraints" triton==3.6.0
fi
"${pip[@]}" install -c "$constraints" -e ".[test]"
# valgrind: callgrind instruction counts of the kernel micro-benchmarks (benchmarks/instructions.py).
# A system package, so only where we are root with apt; elsewhere that benchmark skips with a notice.
if ! command -v valgrind >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; } ||
      echo "notice: apt-get could not install valgrind; benchmarks/instructions.py will be skipped" >&2
  else
    echo "notice: valgrind not installed (needs root and apt-get); benchmarks/instructions.py will be skipped" >&2
  fi
fi
.venv/bin/python -c "import torch, torchrec, fbgemm_gpu; print(f'gembench env ready: torch {torch.__version__}, torchrec {torchrec.__version__}')"
