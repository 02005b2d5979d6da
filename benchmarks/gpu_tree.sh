#!/bin/bash
# The device machine takes the working tree only under 64 MiB (benchmarks/gpu_prepare.sh's header), and Sieve's
# tracked files alone are over it. `slim` takes the three largest tracked paths out of git's index and ignores them
# (.git/info/exclude), so the device call leaves them behind; gpu_run.sh needs none of them (it rebuilds the weights
# from shapes, gpu_models.py, and writes its results under $OUT). `restore` puts them back as they were.
#   bash benchmarks/gpu_tree.sh slim      # after committing, after gpu_prepare.sh, before the device call
#   bash benchmarks/gpu_tree.sh restore   # right after it
#   bash benchmarks/gpu_tree.sh size      # the bytes of the tree a device call would send now (gpu_prepare.sh's)
# `slim` refuses to start with staged or unstaged changes to tracked files, so that `restore` (git reset) only undoes
# what `slim` did.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BIG=(sieve/checkpoints/cross-encoder/model.safetensors sieve/checkpoints/cmc/cmc.safetensors benchmarks/results)
EXCLUDE=$(git rev-parse --git-path info/exclude)
MARK="# gpu_tree.sh slim"
tree_bytes() {  # tracked files and untracked ones git does not ignore: what the device tool copies
  (git ls-files; git ls-files --others --exclude-standard) | sort -u \
    | while IFS= read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && stat -c %s -- "$f"; done | awk '{s += $1} END {print s + 0}'
}
case "${1:-}" in
  size) tree_bytes; exit 0 ;;
  slim)
    git diff --quiet && git diff --cached --quiet || { echo "commit first: tracked files have changes" >&2; exit 2; }
    grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null && { echo "already slim (run restore)" >&2; exit 2; }
    git rm -q -r --cached -- "${BIG[@]}"
    mkdir -p "$(dirname "$EXCLUDE")"
    { echo "$MARK"; printf '/%s\n' "${BIG[@]}"; } >> "$EXCLUDE"
    ;;
  restore)
    git reset -q
    [ -f "$EXCLUDE" ] && sed -i "/^$MARK\$/,+${#BIG[@]}d" "$EXCLUDE"
    ;;
  *) echo "usage: bash benchmarks/gpu_tree.sh slim|restore|size" >&2; exit 2 ;;
esac
echo "$1: the working tree the device call would send is $(tree_bytes) bytes ($(git status --short | wc -l) status lines)"
