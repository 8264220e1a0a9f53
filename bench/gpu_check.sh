#!/usr/bin/env bash
# GPU check of the built-in GPT target; made to work at the first try on a lent GPU machine.
#
# On the lent machine (its image: Python 3.12, torch 2.11 + CUDA 13, no network) this runs with the
# image's python3, the wheels bench/gpu_kit.sh fetched (carried in `.whl`) and PYTHONPATH=src:
# nothing is installed from a network, nothing downloaded, the data is the offline `demo` corpus.
# It installs the carried wheels into a temp folder, then runs bench/gpu_check.py: every step
# time-boxed within --deadline (default 300 s), one summary file $OUT/gpu_check.json (+ the log).
# Steps and figures: see bench/gpu_check.py's docstring. `bench/gpu_kit.sh` prints the exact
# device `run` call; `make gpu-rehearse` rehearses it on CPU.
#
# Usage: bench/gpu_check.sh [--rehearse] [--deadline S] [--budget S] [--dataset demo|climbmix[:N]] [--tune]
# Env: PYTHON (default .venv/bin/python if present, else python3), GPU_WHEELS (default .whl),
#      GPU_TESTS (default tests/harness), OUT (where the summary goes; default ./gpu_check-<time>/),
#      CUDA_VISIBLE_DEVICES (which GPU).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,15p' "$0"; exit 0 ;; esac

cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! "$PY" -c '' 2>/dev/null; then
  echo "gpu_check: no usable Python (\`${PYTHON:-python3}\`); set PYTHON to the interpreter that has torch" >&2
  exit 2
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

WHEELS="${GPU_WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  # The device README's install line, into a fresh folder so nothing of the image changes.
  SITE="$(mktemp -d)/site"
  start=$SECONDS
  if ! timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WHEELS"/*.whl; then
    echo "gpu_check: installing the carried wheels from \`$WHEELS\` failed; re-run bench/gpu_kit.sh for this Python ($("$PY" -V 2>&1))" >&2
    exit 1
  fi
  export PYTHONPATH="$PYTHONPATH:$SITE" GPU_CHECK_SITE="$SITE"
  export GPU_CHECK_WHEELS="$(cd "$WHEELS" && ls -- *.whl | tr '\n' ' ')installed in $((SECONDS - start)) s"
fi
# bubblewrap (the runs' sandbox) when the kit carried it and the machine has none: unpacked into a
# temp folder, never into / (the device README: other packages can break the root there)
DEB=$(compgen -G "$WHEELS/bubblewrap_*.deb" | head -n 1 || true)
if [ -n "$DEB" ] && ! command -v bwrap >/dev/null; then
  ROOT="$(mktemp -d)/bwrap"
  if command -v dpkg-deb >/dev/null && dpkg-deb -x "$DEB" "$ROOT" && [ -x "$ROOT/usr/bin/bwrap" ]; then
    export PATH="$ROOT/usr/bin:$PATH" GPU_CHECK_BWRAP="$(basename "$DEB") unpacked"
  else
    export GPU_CHECK_BWRAP="$(basename "$DEB") could not be unpacked (no dpkg-deb?)"
  fi
fi
exec "$PY" bench/gpu_check.py "$@"
