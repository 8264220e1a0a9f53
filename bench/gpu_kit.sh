#!/usr/bin/env bash
# Kit for bench/gpu_check.sh on a lent GPU machine: run it HERE (network to PyPI), not there.
#
# The lent machine's image has no network; what the check needs and the image lacks must travel
# as wheels inside the working tree, which may be 64 MiB in all. This script
#   1. asks bench/gpu_check.py which required modules the image lacks (REQUIRED minus
#      bench/gpu_image.txt) and downloads their wheels, pinned as pyproject.toml pins them, for
#      CPython 3.12 on manylinux x86-64 (the device README's platform flags), into an ignored folder;
#   2. checks that every wheel's own requirements are on the image or in the kit (--no-deps);
#      and adds bubblewrap's Debian package (the runs' sandbox; the image has none);
#   3. reports the size of the wheels and of the working tree that travels, against 64 MiB;
#   4. prints the exact device `run` call (command, carry, timeout_s).
#
# Usage: bench/gpu_kit.sh [--python-version 3.12] [--dest .whl]
#   (`make gpu-rehearse` also calls it with the rehearsal interpreter's version and its own --dest)
set -euo pipefail
PYVER=3.12
DEST=.whl
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYVER="${2:?--python-version needs a value, e.g. 3.12}"; shift 2 ;;
    --dest) DEST="${2:?--dest needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_kit: unknown option \`$1\`; see --help" >&2; exit 2 ;;
  esac
done
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || { echo "gpu_kit: --python-version \`$PYVER\` is not like 3.12" >&2; exit 2; }

cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY="$(command -v python3)"
LIMIT=$((64 * 1024 * 1024))

mkdir -p "$DEST"
if ! git check-ignore -q "$DEST/probe.whl"; then
  echo "gpu_kit: \`$DEST\` is not ignored by git: it would travel as untracked files and could be committed;" \
       "add \`/$DEST/\` to .gitignore (or .git/info/exclude)" >&2
  exit 2
fi

# --- 1. the wheels: one version of each (two stop the install there), so start from an empty folder
mapfile -t SPECS < <("$PY" bench/gpu_check.py --kit-specs)
rm -f "$DEST"/*.whl
PLATFORMS=()
for n in $(seq 5 39); do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done  # pip matches N exactly
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
echo "== wheels for CPython $PYVER, manylinux x86-64: ${SPECS[*]:-none needed}"
for spec in "${SPECS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" -d "$DEST" "$spec" 2> >(grep -v "is ignored: it is neither" >&2) \
    || { echo "gpu_kit: no wheel of \`$spec\` for CPython $PYVER on manylinux x86-64" >&2; exit 1; }
done

# --- 1b. bubblewrap, the runs' sandbox: not on the image (the H200 runs of 2026-12-04 were
# unsandboxed). Its Debian package travels beside the wheels; gpu_check.sh unpacks it into a temp
# folder there (never into /). Without it the check still runs, its protected step unsandboxed.
rm -f "$DEST"/bubblewrap_*.deb
if (cd "$DEST" && apt-get download -q bubblewrap >/dev/null 2>&1); then
  echo "== bubblewrap: $(cd "$DEST" && ls bubblewrap_*.deb)"
else
  echo "gpu_kit: warning: \`apt-get download bubblewrap\` failed (run \`apt-get update\` once?);" \
       "the protected step will run unsandboxed there" >&2
fi

# --- 2. their own requirements must be on the image or in the kit (pip runs with --no-deps there)
"$PY" - "$DEST" <<'PYEOF'
import re, sys, zipfile
from pathlib import Path
sys.path.insert(0, "bench")
from gpu_check import read_image_list, _norm

image = read_image_list()
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
kit = {_norm(w.name.split("-")[0]) for w in wheels}
missing = []
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    for req in re.findall(r"^Requires-Dist: (.*)$", meta, re.M):
        if "extra ==" in req:
            continue
        name = _norm(re.match(r"[A-Za-z0-9_.\-]+", req).group(0))
        if name not in image and name not in kit:
            missing.append(f"{w.name} needs {req.strip()}")
if missing:
    sys.exit("gpu_kit: not on the image and not in the kit: " + "; ".join(missing)
             + ". Add the module to REQUIRED in bench/gpu_check.py")
print(f"== requirements of the {len(wheels)} wheel(s): all on the image or in the kit")
PYEOF

# --- 3. sizes: the wheels, and everything that travels (tracked + untracked-not-ignored, shared/)
size_of() { xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
WHEEL_BYTES=$(find "$DEST" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.deb' \) -print0 | size_of)
TREE_BYTES=$(git ls-files -z --cached --others --exclude-standard | size_of)
SHARED_BYTES=0
[ -d shared ] && ! git ls-files --error-unmatch shared >/dev/null 2>&1 && SHARED_BYTES=$(find shared -type f -print0 | size_of)
TOTAL=$((WHEEL_BYTES + TREE_BYTES + SHARED_BYTES))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "== size: wheels $(mib "$WHEEL_BYTES") + working tree $(mib "$TREE_BYTES") + shared/ $(mib "$SHARED_BYTES")" \
     "= $(mib "$TOTAL") of $(mib "$LIMIT") ($((100 * TOTAL / LIMIT)) %)"
find "$DEST" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.deb' \) -printf '   %f  %s bytes\n'
if [ "$TOTAL" -gt "$LIMIT" ]; then
  echo "gpu_kit: $(mib "$TOTAL") would travel, over the 64 MiB limit; ignore build outputs or carry less" >&2
  exit 1
fi

# --- 4. the device call. The device sends the checkout the session was started in: run this there.
cat <<CALL
== device call (run this kit in the checkout the session was started in: the device sends that one)
run(
  command   = "bash bench/gpu_check.sh --deadline 480 --budget 75 --tune 2>&1",
  carry     = ["$DEST"],
  timeout_s = 540,
)
   Measured on an H200 (2026-12-04): this check took 355 s, plus ~35 s to start the machine.
   A 75 s budget gives a warm-up cap (a quarter of it) above the ~10 s a warm compile takes; at
   30 s the compile ran into the timed budget and the figures were not the model's speed. That is
   ~6.5 of the 15 device minutes (9.5 at the timeout), leaving one rerun.
   Then give_back (unless rerunning at once); the summary comes back as gpu_check.json
   (+ gpu_check.log) under the reply's files_at.
CALL
