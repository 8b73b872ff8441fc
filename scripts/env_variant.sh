#!/usr/bin/env bash
# Makes a second environment that differs from an existing one in ONE package, for
# `gembench continuous --python BASE_PY --python HEAD_PY` (a dependency upgrade, same code).
#
#   scripts/env_variant.sh DEST PACKAGE==VERSION [BASE_VENV]
#   e.g. scripts/env_variant.sh /tmp/venv-torchrec170 torchrec==1.7.0
#        gembench continuous HEAD HEAD --python .venv/bin/python --python /tmp/venv-torchrec170/bin/python
#
# DEST is a fresh virtualenv (no pip of its own) whose site-packages holds PACKAGE==VERSION alone,
# installed --no-deps; a .pth file then adds BASE_VENV's site-packages (default .venv) after it,
# .pth files and all. Python finds DEST's copy of PACKAGE first and everything else in BASE_VENV,
# so nothing is copied or downloaded but the one package, and BASE_VENV is not touched.
# `python -m importlib.metadata`-style lookups (what gembench records) see DEST's version first.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,13p "$0" >&2; exit 2; }
dest=$1
spec=$2
base=$(realpath "${3:-$(cd "$(dirname "$0")/.." && pwd)/.venv}")  # a symlinked .venv: its target, which outlives the link
base_py=$base/bin/python
[ -x "$base_py" ] || { echo "env_variant.sh: $base_py is not an interpreter; pass the base virtualenv" >&2; exit 2; }
[ -e "$dest" ] && { echo "env_variant.sh: $dest exists; remove it or pick another DEST" >&2; exit 2; }
case "$spec" in *==*) ;; *) echo "env_variant.sh: pin the package, PACKAGE==VERSION (got $spec)" >&2; exit 2 ;; esac

base_site=$("$base_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$base_py" -m venv --without-pip "$dest"
site=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# pip runs from the base environment and installs into DEST's site-packages only
"$base_py" -m pip -q --disable-pip-version-check install --no-deps --target "$site" "$spec"
# an `import` line in a .pth file is executed: addsitedir also runs BASE_VENV's own .pth files
# (the editable gembench, setuptools' shims), and appends it after DEST's site-packages
echo "import site; site.addsitedir('$base_site')" > "$site/zz-base-venv.pth"
name=${spec%%==*}
"$dest/bin/python" -c "from importlib import metadata; print('$dest: $name', metadata.version('$name'), '(over $base)')"
