#!/usr/bin/env bash
# asv publish, then make the HTML open without internet: asv's pages load jQuery, flot,
# bootstrap and friends from CDNs, which offline machines (CI, this project's) cannot reach.
# The same versions come from the npm registry (npm pack) into results/html/vendor/.
#
#   scripts/asv_publish.sh && (cd results/html && python3 -m http.server 8000 --bind 127.0.0.1)
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/asv publish "$@"
html=results/html
command -v npm >/dev/null || { echo "asv_publish: no npm: pages keep their CDN links" >&2; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# CDN URL prefix | npm package@version | file inside the package
vendor=(
  "https://code.jquery.com/jquery-3.3.1.min.js|jquery@3.3.1|dist/jquery.min.js"
  "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js|flot@0.8.3|jquery.flot.js"
  "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js|flot@0.8.3|jquery.flot.time.js"
  "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js|flot@0.8.3|jquery.flot.selection.js"
  "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js|flot@0.8.3|jquery.flot.categories.js"
  "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js|flot-orderbars@1.0.0|js/jquery.flot.orderBars.js"
  "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js|stupid-table-plugin@1.1.3|stupidtable.min.js"
  "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js|blueimp-md5@2.19.0|js/md5.min.js"
  "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js|bootstrap@3.1.1|dist/js/bootstrap.min.js"
  "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css|bootstrap@3.1.1|dist/css/bootstrap.min.css"
)
mkdir -p "$html/vendor"
for entry in "${vendor[@]}"; do
  IFS='|' read -r url pkg file <<<"$entry"
  dir="$work/${pkg//[@\/]/_}"
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "$pkg" >/dev/null && tar xzf ./*.tgz)
  fi
  local_name="vendor/$(basename "$url")"
  cp "$dir/package/$file" "$html/$local_name"
  for page in "$html"/*.html; do
    sed -i "s|$url|$local_name|g" "$page"
  done
done
# The CDN tags pin subresource hashes of the CDN's minified builds; npm ships other builds of
# the same versions, so the pins go (the files are local now, nothing in transit to guard).
sed -i -E 's/ (integrity|crossorigin)="[^"]*"//g' "$html"/*.html
echo "asv_publish: $html opens offline ($(ls "$html/vendor" | wc -l) vendored files)"
