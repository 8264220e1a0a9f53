#!/usr/bin/env bash
# Dress rehearsal of bench/gpu_check.sh on this CPU machine (`make gpu-rehearse`), so that an
# import or version problem shows up here, not in the 15 minutes of a lent GPU.
#
# Each leg is a fresh virtual environment that holds only packages on the image's list
# (bench/gpu_image.txt), at the image's versions where the list gives them and a wheel exists,
# plus the kit's wheels installed the way the device installs them; nightlab itself is not
# installed (PYTHONPATH=src, as there). A package in a leg's venv that is not on the image's list
# fails the rehearsal.
#   leg py312: the image's Python (3.12) and numpy 2.5.2, the kit's real wheels (.whl), no torch:
#              PyPI has no CPU torch for Linux x86-64 (its torch wheels are the CUDA build, ~2 GB
#              with their nvidia-* wheels) and PyTorch's own CPU index is not reachable here; so
#              the steps needing torch report "skipped: rehearsal without torch".
#   leg torch: Python 3.11 with the pinned CPU torch (torch==2.13.0, a wheel on this machine's
#              disk, cp311 only) and the kit fetched for 3.11: every step, GPU-only ones "skipped:
#              no CUDA", training on the `cpu` profile for 5 s.
# Env: REHEARSE_PY312 / REHEARSE_PY_TORCH (interpreters), REHEARSE_TORCH (default torch==2.13.0).
# Output: .gpu-rehearse/out-<leg>/gpu_check.json and .log; exit 0 when both legs passed.
set -euo pipefail
cd "$(dirname "$0")/.."
R=.gpu-rehearse
mkdir -p "$R"

find_python() {  # find_python 3.12: an interpreter of that version (PATH, then pyenv's versions)
  local v=$1 p
  for p in "python$v" "$(pyenv root 2>/dev/null)/versions/$v"*/bin/"python$v"; do
    if "$p" -c "import sys; assert sys.version_info[:2] == ($(echo "$v" | tr . ,))" 2>/dev/null; then
      command -v "$p" || echo "$p"
      return 0
    fi
  done
  echo "gpu_rehearse: no Python $v here (install it, e.g. \`pyenv install $v\`, or set REHEARSE_PY${v/./})" >&2
  return 1
}

pip_q() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

make_venv() {  # make_venv DIR PYTHON SPEC...: a venv holding exactly SPEC (image's version, else pyproject's pin)
  local dir=$1 py=$2
  shift 2
  local stamp
  stamp="$("$py" -V 2>&1) $*"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then return 0; fi
  rm -rf "$dir"
  "$py" -m venv "$dir"
  local spec loose
  for spec in "$@"; do
    if ! pip_q "$dir/bin/pip" install -q "$spec" 2>/dev/null; then
      # e.g. numpy==2.5.2 has no wheel for Python 3.11: take what pyproject.toml allows
      loose="$(.venv/bin/python bench/gpu_check.py --image-specs --loose | grep -iE "^${spec%%==*}([<>=!~ ]|$)" || echo "${spec%%==*}")"
      echo "   $spec: no wheel for $("$py" -V 2>&1); installing $loose"
      pip_q "$dir/bin/pip" install -q "$loose"
    fi
  done
  # Only the image's packages may be there: anything else would hide a ModuleNotFoundError.
  "$dir/bin/python" -m pip list --format=freeze 2>/dev/null | "$dir/bin/python" -c '
import re, sys
sys.path.insert(0, "bench")
from gpu_check import _norm, read_image_list
image = read_image_list()
extra = [l.strip() for l in sys.stdin if _norm(re.split("[=@ ]", l.strip())[0]) not in image]
if extra:
    sys.exit("gpu_rehearse: the venv holds packages the image lacks: " + ", ".join(extra))
'
  echo "$stamp" >"$dir/.stamp"
}

status=0
summary() {  # summary LEG: the key lines of a leg's summary
  echo "== leg $1: $(grep -E '^(python / torch|step )' "$R/out-$1/gpu_check.log" | tr -s ' ' | paste -sd ';' -)"
}

# Both legs need .venv's Python only to read pyproject.toml and the lists (stdlib + tomllib).
[ -x .venv/bin/python ] || { echo "gpu_rehearse: run \`make install\` first" >&2; exit 2; }
mapfile -t IMAGE_SPECS < <(.venv/bin/python bench/gpu_check.py --image-specs)

echo "== leg py312: the image's Python, the kit's real wheels, no torch"
PY312="${REHEARSE_PY312:-$(find_python 3.12)}"
make_venv "$R/py312" "$PY312" "${IMAGE_SPECS[@]}"
bash bench/gpu_kit.sh --python-version 3.12 --dest .whl
rm -rf "$R/out-py312"
PYTHON="$R/py312/bin/python" GPU_WHEELS=.whl OUT="$R/out-py312" \
  bash bench/gpu_check.sh --rehearse --without torch || status=1

echo "== leg torch: Python 3.11 with the CPU build of ${REHEARSE_TORCH:-torch==2.13.0}, the kit for 3.11"
PYT="${REHEARSE_PY_TORCH:-$(find_python 3.11)}"
make_venv "$R/torch" "$PYT" "${REHEARSE_TORCH:-torch==2.13.0}" "${IMAGE_SPECS[@]}"
PYTV="$("$PYT" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
bash bench/gpu_kit.sh --python-version "$PYTV" --dest "$R/whl-torch" >/dev/null
rm -rf "$R/out-torch"
PYTHON="$R/torch/bin/python" GPU_WHEELS="$R/whl-torch" OUT="$R/out-torch" \
  bash bench/gpu_check.sh --rehearse || status=1

summary py312
summary torch
[ "$status" = 0 ] && echo "== rehearsal passed" || echo "== rehearsal FAILED (see $R/out-*/gpu_check.log)"
exit "$status"
