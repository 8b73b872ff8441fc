#!/usr/bin/env bash
# The GPU check: what a GPU run of gembench looks like, in under 8 minutes on one
# H100/H200. Every step is bounded (few steps, a timeout, one shared time budget); results go to
# results/runs/gpu-check-*.json; a summary table ends it.
#
#   1. medium, optimized stack, as shipped (batch 2048)
#   2. --ab (baseline vs optimized, interleaved) at the largest batch the memory estimate says both
#      stacks fit together on this device (the padded fp32 baseline does not fit medium's 2048)
#   3. dcnv2, optimized, --batch 8192
#   4. python3 benchmarks/attention_gpu.py, when that file exists
#   5. summary: config, stack, batch, step ms, MFU, peak memory vs estimate, cost counters
#
# On the gpu-kit machine (torch 2.11 with CUDA, no package index), from the project root:
#   source .gpu-kit/setup.sh && scripts/gpu_check.sh
# With a .venv (scripts/setup.sh --gpu): scripts/gpu_check.sh
# Dry run of every step on CPU with tiny sizes (what CI can check):
#   GEMBENCH_DEVICE=cpu scripts/gpu_check.sh
#
# Environment: GEMBENCH_DEVICE (cuda), GPU_CHECK_BUDGET_S (450: all steps together), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
device=${GEMBENCH_DEVICE:-cuda}
budget=${GPU_CHECK_BUDGET_S:-450}
started=$(date +%s)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out_dir=results/runs
mkdir -p "$out_dir"

if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi
if [ -f .gpu-kit/setup.sh ] && ! "$py" -c "import fbgemm_gpu, torchrec, gembench" 2>/dev/null; then
  echo "gpu_check: sourcing .gpu-kit/setup.sh (fbgemm-gpu and torchrec for this python)"
  # shellcheck disable=SC1091
  source .gpu-kit/setup.sh || { echo "gpu_check: .gpu-kit/setup.sh failed" >&2; exit 2; }
fi
if ! "$py" -c "import gembench" 2>/dev/null; then
  echo "gpu_check: $py cannot import gembench: use .venv (scripts/setup.sh) or source .gpu-kit/setup.sh" >&2
  exit 2
fi

if [ "$device" = cpu ]; then  # dry run: every step, tiny sizes
  big=tiny; ref=dcnv2; ref_batch=256; steps=(--steps 2 --warmup 1); ab_steps=(--rounds 2 --steps 2 --warmup 1)
else
  "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "gpu_check: no CUDA device visible (GEMBENCH_DEVICE=cpu for a dry run)" >&2; exit 2; }
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
  big=medium; ref=dcnv2; ref_batch=8192; steps=(--steps 5 --warmup 2); ab_steps=(--rounds 2 --steps 4 --warmup 1)
fi

results=()
status=()
left() { echo $(( budget - ($(date +%s) - started) )); }

# step NAME MAX_S COMMAND...: run COMMAND under the smaller of MAX_S and the budget left.
step() {
  local name=$1 max_s=$2; shift 2
  local remaining; remaining=$(left)
  if (( remaining < 20 )); then
    echo "gpu_check: [$name] skipped: the ${budget}s budget is spent"; status+=("$name: skipped (budget)"); return
  fi
  local limit=$(( max_s < remaining ? max_s : remaining ))
  echo; echo "gpu_check: [$name] (at most ${limit}s): $*"
  local t0; t0=$(date +%s)
  timeout --signal=INT --kill-after=15 "$limit" "$@"
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  case $rc in
    0) status+=("$name: ok, ${took}s") ;;
    124|137) status+=("$name: TIMED OUT after ${took}s") ;;
    *) status+=("$name: exit $rc after ${took}s") ;;
  esac
}

# run NAME MAX_S ARGS...: `gembench run` with a result file under results/runs/.
run() {
  local name=$1 max_s=$2; shift 2
  local out="$out_dir/gpu-check-$stamp-$name.json"
  step "$name" "$max_s" "$py" -m gembench run --device "$device" --quiet --out "$out" "$@"
  [ -f "$out" ] && results+=("$out")
}

echo "gpu_check: device $device, budget ${budget}s, python $py"
"$py" -m gembench describe --config "$big" | tail -9

run "$big-optimized" 210 --config "$big" --stack optimized "${steps[@]}"

# The largest batch (a multiple of 8) at which both stacks fit together, by the estimate.
ab_batch=$("$py" - "$big" "$device" <<'EOF'
import sys
from gembench.harness.device.hardware import memory_available, resolve_device
from gembench.harness.train.runner import FIT_SHARE, largest_fitting_batch
from gembench.harness.train.stack import STACKS
from gembench.models.config import load_config

cfg, dev = load_config(sys.argv[1]), resolve_device(sys.argv[2])
best = largest_fitting_batch(cfg, [STACKS["baseline"], STACKS["optimized"]], dev.type,
                             FIT_SHARE * memory_available(dev))
print(best if best < 8 else best - best % 8)
EOF
)
if [ "${ab_batch:-0}" -gt 0 ] 2>/dev/null; then
  run "$big-ab" 150 --config "$big" --ab --batch "$ab_batch" "${ab_steps[@]}"
else
  echo "gpu_check: [$big-ab] skipped: both stacks together fit no batch on this device"
  status+=("$big-ab: skipped (does not fit)")
fi

run "$ref-optimized" 90 --config "$ref" --stack optimized --batch "$ref_batch" "${steps[@]}"

if [ -f benchmarks/attention_gpu.py ]; then
  if [ "$device" = cpu ]; then
    echo "gpu_check: [attention] skipped in the CPU dry run (a GPU benchmark)"; status+=("attention: skipped (cpu)")
  else
    step attention 120 "$py" benchmarks/attention_gpu.py
  fi
else
  echo "gpu_check: [attention] skipped: benchmarks/attention_gpu.py does not exist"
  status+=("attention: skipped (no benchmarks/attention_gpu.py)")
fi

echo; echo "gpu_check: summary (${#results[@]} results under $out_dir/, $(( $(date +%s) - started ))s)"
if [ ${#results[@]} -gt 0 ]; then
  "$py" - "${results[@]}" <<'EOF'
import json
import sys

from tabulate import tabulate

rows, counters = [], []
for path in sys.argv[1:]:
    r = json.load(open(path))
    s = r["summary"]
    est, run = s.get("peak_memory_estimate_bytes"), s.get("peak_memory_run_bytes")
    ratio = r["metrics"].get("ab_mfu_ratio")  # --ab: optimized's row, with its MFU ratio over baseline
    stack = f"ab ({ratio:.2f}x)" if ratio else r["run"]["stack"]
    rows.append([r["config"]["name"], stack, r["run"]["global_batch"],
                 f"{1e3 * s['step_time_s']['p50']:.1f}", f"{100 * s['mfu']:.2f}%",
                 f"{run / 2**30:.1f}" if run else "-", f"{est / 2**30:.1f}" if est else "-",
                 f"{est / run:.2f}" if est and run else "-", r["run"]["device"]])
    if r.get("counters"):
        counters.append([r["config"]["name"], r["run"]["stack"],
                         *(r["counters"].get(k) for k in ("aten_ops", "host_syncs", "h2d_bytes", "kernels",
                                                          "graph_breaks", "recompiles"))])
print(tabulate(rows, headers=["config", "stack", "batch", "step ms", "MFU", "peak GiB", "estimate GiB",
                              "est/peak", "device"], colalign=("left", "left", "right", "right", "right",
                                                               "right", "right", "right", "left")))
if counters:
    print()
    print(tabulate(counters, headers=["config", "stack", "aten ops", "host syncs", "h2d bytes", "kernels",
                                      "graph breaks", "recompiles"]))
else:
    print("\n(no cost counters in these results)")
EOF
fi
echo
printf 'gpu_check: %s\n' "${status[@]}"
case " ${status[*]} " in *"TIMED OUT"*|*"exit "*) exit 1 ;; esac
exit 0
