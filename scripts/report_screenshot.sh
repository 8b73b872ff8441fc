#!/usr/bin/env bash
# Regenerates results/report/screenshot.png, the README's picture of `gembench report`, from real
# runs of CONFIG (default small): a replicate pair at HEAD~1 (promoted to a temporary baseline),
# and at the working tree two runs on one process and one on 2 ranks. HEAD~1 is checked out as a
# temporary git worktree so its runs carry its own commit. Minutes on 2 cores: run it on a quiet
# machine, and name the machine and commit in the README's caption.
#
#   scripts/report_screenshot.sh                # writes results/report/screenshot.png
#   CONFIG=tiny KEEP=/tmp/rep scripts/report_screenshot.sh  # tiny; also keeps the runs and the page
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-$root/.venv/bin/python}
tmp=$(mktemp -d)
worktrees=()
cleanup() {
  for w in "${worktrees[@]}"; do git worktree remove --force "$w" >/dev/null 2>&1 || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/runs"

config=${CONFIG:-small}
run_at() {  # run_at REV NAME ARGS...: a run of the code at REV (WORKTREE = the checkout as it is)
  local rev=$1 name=$2; shift 2
  local pkg=$tmp/pkg-$rev
  if [ ! -e "$pkg/gembench" ]; then
    mkdir -p "$pkg"
    if [ "$rev" = WORKTREE ]; then
      ln -s "$root" "$pkg/gembench"
    else
      git worktree add --detach "$tmp/src-$rev" "$rev" >/dev/null 2>&1
      worktrees+=("$tmp/src-$rev")
      ln -s "$tmp/src-$rev" "$pkg/gembench"
    fi
  fi
  echo "report_screenshot: $name at $rev: gembench run --config $config $*" >&2
  PYTHONPATH=$pkg "$py" -m gembench run --config "$config" --warmup 2 --out "$tmp/runs/$name.json" "$@" >/dev/null 2>"$tmp/$name.log" \
    || { tail -20 "$tmp/$name.log" >&2; exit 1; }
}

run_at HEAD~1 base-1 --steps 6
run_at HEAD~1 base-2 --steps 6
PYTHONPATH=$tmp/pkg-HEAD~1 "$py" -m gembench promote "$tmp/runs/base-1.json" "$tmp/runs/base-2.json" --baselines "$tmp/baselines" >&2
run_at WORKTREE now-1 --steps 6
run_at WORKTREE now-2 --steps 6
run_at WORKTREE ranks --nproc 2 --steps 6

export PYTHONPATH=$tmp/pkg-WORKTREE
"$py" -m gembench report "$tmp/runs" "$tmp/baselines" --out "$tmp/report"
mkdir -p results/report
"$py" scripts/page_check.py "$tmp/report/index.html" --screenshot results/report/screenshot.png \
  --width 1280 --max-height 2300 --scale 0.75 --colors 160
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp -r "$tmp/runs" "$tmp/baselines" "$tmp/report" "$KEEP/"; fi
