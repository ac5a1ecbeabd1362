#!/usr/bin/env bash
# Body of slurm/train.sbatch and slurm/multinode.sbatch, which exec it from the batch shell: it
# keeps the batch shell's pid, so the signals Slurm sends to the batch shell land here.
# Runs gpt2-train as one job step (one rank per task), forwards USR1/TERM to it, and when the
# trainer saved a checkpoint because of them (exit code 3) requeues the job, which then resumes
# from that checkpoint (--checkpoint.resume=auto). Settings: see the top of slurm/train.sbatch.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${GPT2_BIN:-$root/build/bin/gpt2-train}"
[ -x "$bin" ] || { echo "slurm/job.sh: $bin not found; run launch/build.sh first" >&2; exit 2; }
cd "$root" || exit 2  # relative paths mean what they mean to launch/train.sh

# Options the trainer refuses to see twice are only added when the arguments lack them.
args=("$@")
has() {
  local a; for a in "${args[@]}"; do case "$a" in "--$1" | "--$1="*) return 0 ;; esac; done; return 1
}
has config || args=(--config "${GPT2_CONFIG:-configs/gpt2-124m.ini}" "${args[@]}")
has checkpoint.resume || args+=(--checkpoint.resume=auto)
[ -n "${GPT2_CKPT_DIR:-}" ] && ! has checkpoint.dir && args+=("--checkpoint.dir=$GPT2_CKPT_DIR")

# One rank per task; torch's intra-op threads share the task's CPUs.
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  per_node=${SLURM_NTASKS_PER_NODE:-$(( ${SLURM_NTASKS:-1} / ${SLURM_NNODES:-1} ))}
  t=${SLURM_CPUS_PER_TASK:-$(( ${SLURM_CPUS_ON_NODE:-1} / (per_node > 0 ? per_node : 1) ))}
  export OMP_NUM_THREADS=$(( t >= 1 ? t : 1 ))
fi

# srun --mpi=pmix is Slurm's own launcher (it signals and reaps every task); mpirun inside the
# allocation (through launch/train.sh) serves clusters whose Slurm has no PMIx.
launcher="${GPT2_LAUNCHER:-auto}"
if [ "$launcher" = auto ]; then
  launcher=mpirun; srun --mpi=list 2>&1 | grep -qw "${GPT2_SRUN_MPI:-pmix}" && launcher=srun
fi
echo "[slurm] job ${SLURM_JOB_ID:-?} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-?}:" \
     "${SLURM_NTASKS:-1} rank(s) via $launcher, OMP_NUM_THREADS=$OMP_NUM_THREADS"
if [ "$launcher" = srun ]; then
  # --kill-on-bad-exit: one failed rank ends the step instead of leaving the others in a collective.
  # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the allocation; pass it on.
  srun --kill-on-bad-exit=1 --mpi="${GPT2_SRUN_MPI:-pmix}" \
       ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} "$bin" "${args[@]}" &
else
  GPT2_BIN="$bin" "$root/launch/train.sh" -np "${SLURM_NTASKS:-1}" "${args[@]}" &
fi
step=$!

# Both signals go on as USR1, which the trainer treats like TERM (finish the step, save, exit 3):
# srun answers TERM by terminating the step, mpirun by killing the ranks after a moment.
warned=""
forward() { echo "[slurm] got SIG$1: the ranks checkpoint"; kill -USR1 "$step" 2>/dev/null; }
trap 'warned=1; forward USR1' USR1
trap 'forward TERM' TERM
# A trapped signal interrupts `wait` (status > 128) while the step runs on: wait again.
while :; do
  wait "$step"; rc=$?
  kill -0 "$step" 2>/dev/null || break
done
# It may also have ended just after the signal: a second wait gives its status (bash >= 5.1).
[ "$rc" -gt 128 ] && { wait "$step"; r=$?; [ "$r" -ne 127 ] && rc=$r; }

[ "$rc" -eq 3 ] || exit "$rc"

# The ranks saved a checkpoint because of a signal. Requeue (the job keeps its id: its log is
# appended to, and resume=auto finds the checkpoint) unless Slurm did already (PreemptMode=REQUEUE)
# or a user cancelled the job: scancel sends TERM just as preemption and the time limit do, and
# only slurmstepd's line in the job's log tells them apart ("CANCELLED AT t [DUE TO ...]").
info="$(scontrol show job "${SLURM_JOB_ID:-}" 2>/dev/null)"
restarts="$(sed -n 's/.*Restarts=\([0-9]*\).*/\1/p' <<<"$info")"
if [ -n "$restarts" ] && [ "$restarts" != "${SLURM_RESTART_COUNT:-0}" ]; then
  echo "[slurm] checkpoint saved; Slurm requeued the job itself"; exit 0
fi
if [ -z "$warned" ]; then
  log="$(sed -n 's/^ *StdErr=//p' <<<"$info")"
  why="$(tail -c 1000000 "$log" 2>/dev/null | grep -a -o 'CANCELLED AT [^*]*' | tail -n 1)"
  case "$why" in
    *"DUE TO"*) ;;
    *) echo "[slurm] checkpoint saved; job cancelled (${why:-no reason in $log}): not requeued"; exit 3 ;;
  esac
fi
echo "[slurm] checkpoint saved; requeueing job ${SLURM_JOB_ID:-?}"
scontrol requeue "${SLURM_JOB_ID:-}" && exit 0
echo "[slurm] requeue refused; resubmit the same command to resume from the checkpoint" >&2
exit 3
