# nightlab's per-experiment run script on a SkyPilot worker (`fleet/sky_task.py` experiment_task,
# and the resident runner's runs). Run by bash with the job's environment; prints the tags the
# controller reads back (`fleet/job_log.py`): nightlab-gpu/start/end/code/score/health/exit.
#
# The per-experiment run. It never touches the shared workdir: the snapshot comes out of
# the job's own environment into a directory named for the attempt. With NIGHTLAB_SUPERVISE=1
# (the built-in target) the command runs under the harness's supervisor, as on a local slot
# (`harness/attempt.py`: sandbox, clock and wall checks, digests, the scorer), and its
# `score.json` comes back on the job's last lines, after every process of the run has ended
# (see `save_score` for why a line train.py printed cannot stand in for it). `-I`: the
# snapshot (the cwd) must not shadow the installed harness, and PYTHONPATH does not count.
set -u
venv="${NIGHTLAB_VENV:-$HOME/nightlab-venv}"; venv="${venv/#\~/$HOME}"
if [ -f "$venv/bin/activate" ]; then . "$venv/bin/activate"; fi
export NIGHTLAB_LAB="$HOME/sky_workdir" PYTHONUNBUFFERED=1
run_dir="$HOME/nightlab/runs/$NIGHTLAB_RUN"
supervise="${NIGHTLAB_SUPERVISE:-0}"; unset NIGHTLAB_SUPERVISE
work="$run_dir"; if [ "$supervise" = 1 ]; then work="$run_dir/work"; fi
hashing="$run_dir.code"  # the code hash's channel (below); beside the run, not in its directory
rm -rf "$run_dir" "$hashing" && mkdir -p "$work" "$hashing"
i=0
while [ "$i" -lt "$NIGHTLAB_PAYLOAD_CHUNKS" ]; do
  eval "printf '%s' \"\$NIGHTLAB_PAYLOAD_$i\""
  i=$((i + 1))
done | base64 -d | tar -xzf - -C "$work"
if [ $? -ne 0 ]; then echo "nightlab: the snapshot payload could not be unpacked"; echo "nightlab-exit: 97"; exit 97; fi
unset $(env | sed -n 's/^\(NIGHTLAB_PAYLOAD_[0-9]*\)=.*/\1/p')
# The code hash of the nightlab this run imports is taken after the run (so a run that changed
# the installed nightlab is caught), but its interpreter starts now, so its start-up and imports
# are not between two runs (the script's time after the command: 0.093 -> 0.027 s at load 2,
# bench/RESULTS.md; more under load). It reads
# the package's files only at EOF on the FIFO, which comes when the script closes its end after
# the command (no process of the run holds that end: it is closed for the command; a sandboxed
# run's processes all end with it). From /, so no folder shadows it; PYTHONPATH counts, as it
# does for the run. Without a FIFO the hash is taken after the command, as below.
hasher=""
if mkfifo "$hashing/go" 2>/dev/null; then
  (cd / && exec python -m nightlab.fleet.build hash --on-eof <"$hashing/go" >"$hashing/code" 2>/dev/null) &
  hasher=$!
  exec {go}>"$hashing/go"
else
  exec {go}>/dev/null
fi
# A lane of an N-slot cluster (NIGHTLAB_GPU, NIGHTLAB_SLOTS; docs/skypilot.md "Several slots per
# cluster") runs on its own GPU(s) with 1/N of the node's CPUs (the cgroup's quota where one is
# set: a container's share, not the host's cores), and has a run lock of its own. Slurm gives each
# lane's job a whole GPU of its own and may confine the step to that device (ConstrainDevices), so
# there its choice stands; Ray may pack two fractional jobs onto one GPU, so there the lane pins.
# A one-slot cluster sees what the job was given, as before.
lock="$HOME/.nightlab-run.lock"
if [ -n "${NIGHTLAB_GPU:-}" ]; then
  if [ -z "${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}" ] || [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
    export CUDA_VISIBLE_DEVICES="$NIGHTLAB_GPU"
  fi
  lock="$HOME/.nightlab-run-g${NIGHTLAB_GPU%%,*}.lock"
  cpus=$(nproc --all 2>/dev/null || echo 1)
  if [ -r /sys/fs/cgroup/cpu.max ] && read -r quota period </sys/fs/cgroup/cpu.max && [ "$quota" != max ]; then
    cpus=$(( (quota + period - 1) / period ))
  fi
  threads=$(( cpus / ${NIGHTLAB_SLOTS:-1} )); if [ "$threads" -lt 1 ]; then threads=1; fi
  export NIGHTLAB_THREADS="$threads" OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
  export MKL_NUM_THREADS="${MKL_NUM_THREADS:-$threads}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$threads}"
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "nightlab-gpu: ${gpu:-none}"
# One experiment at a time per cluster (per lane), whatever SkyPilot's scheduler would let run beside it
# (on Ray-based infra a fractional request could share a GPU; on Slurm each job is an exclusive
# step that asks for the GPU and every CPU of the cluster, so Slurm already serialises them):
# a next one that starts early waits here with its snapshot unpacked. Its budget starts at
# `nightlab-start:`, not at `sky exec`. The run inherits the lock: a process it leaves behind
# keeps the next one waiting.
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
echo "nightlab-start: $(date +%s.%N)"
# The run's machine health, sampled beside it by the mark its processes inherit (the resident
# runner sets one; `sky exec` does not), judged by the controller (`fleet/worker_health.py`). The
# sampler holds neither the lock nor the hasher's FIFO: the next run and the hash never wait on it.
export NIGHTLAB_ATTEMPT="${NIGHTLAB_ATTEMPT:-sky/$NIGHTLAB_RUN/$$}"
(cd / && exec python -m nightlab.fleet.worker_health --mark "$NIGHTLAB_ATTEMPT" --threads "${NIGHTLAB_THREADS:-0}" \
  --exclude $$ $hasher --out "$hashing/health.json" >/dev/null 2>&1 9>&- {go}>&-) &
sampler=$!
cd "$work"
# stderr joins stdout here: SkyPilot on Slurm carries the two apart and reordered a traceback
# before the lines printed ahead of it (the conformance suite's crash scenario, real SDK)
if [ "$supervise" = 1 ]; then
  timeout -k 10 "$NIGHTLAB_REMOTE_TIMEOUT" python -I -m nightlab.harness.attempt \
    --run-dir "$run_dir" --lab "$NIGHTLAB_LAB" -- "$NIGHTLAB_COMMAND" 2>&1 {go}>&-
else
  timeout -k 10 "$NIGHTLAB_REMOTE_TIMEOUT" bash -c "$NIGHTLAB_COMMAND" 2>&1 {go}>&-
fi
code=$?
echo "nightlab-end: $(date +%s.%N)"
kill -TERM "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
# the experiment is over: a next job waiting at the lock may start while this one reports; on
# Slurm the next job's step waits for this whole job to exit instead (docs/skypilot.md, "Pipelining")
exec 9>&-
cd "$HOME"
# now the hasher reads the package's files (above): a result from other code is `invalid`; the
# hash is taken the old way if that process is gone (an unsandboxed run may have ended it)
exec {go}>&-
if [ -n "$hasher" ]; then wait "$hasher"; fi
nightlab_code=$(cat "$hashing/code" 2>/dev/null)
if [ -z "$nightlab_code" ]; then nightlab_code=$(cd / && python -m nightlab.fleet.build hash 2>/dev/null || echo none); fi
echo "nightlab-code: $nightlab_code"
if [ "$supervise" = 1 ]; then
  echo "nightlab-score: $(base64 -w0 "$run_dir/score.json" 2>/dev/null || echo none)"
fi
echo "nightlab-health: $(base64 -w0 "$hashing/health.json" 2>/dev/null || echo none)"
echo "nightlab-exit: $code"
rm -rf "$run_dir" "$hashing"
exit $code
