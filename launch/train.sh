#!/usr/bin/env bash
# Runs gpt2-train on this node through mpirun, one rank per GPU (or -np N; 1 on a machine without
# GPUs). Everything after the options goes to gpt2-train:
#   launch/train.sh --config configs/gpt2-124m.ini --data.train=... [--section.key=value ...]
#   launch/train.sh -np 2 --config configs/tiny.ini --train.device=cpu
# Ctrl-C (INT) or TERM: every rank finishes its step, they save a checkpoint together and the script
# exits 3 (resume with --checkpoint.resume=auto); a second INT or TERM stops at once, without one.
# Otherwise the exit code is mpirun's. README "Stopping a run" says what each launcher does.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
np=""
if [ "${1:-}" = "-np" ] || [ "${1:-}" = "-n" ]; then np="$2"; shift 2; fi
if [ -z "$np" ]; then
  np=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "${np:-0}" -ge 1 ] || np=1
fi
bin="${GPT2_BIN:-$root/build/bin/gpt2-train}"
[ -x "$bin" ] || { echo "train.sh: $bin not found; run launch/build.sh first" >&2; exit 2; }
mpi_flags=(-np "$np" --bind-to none)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
# More ranks than cores (CPU runs on small machines) is fine for mpirun with --oversubscribe.
[ "$np" -gt "$(nproc)" ] && mpi_flags+=(--oversubscribe)
# Pass NCCL and CUDA settings (including the NVLink-multicast switches) to every rank.
for v in $(env | grep -oE '^(NCCL|CUDA|TORCH|NVSHMEM|OMP|GPT2)_[A-Z_]*' || true); do mpi_flags+=(-x "$v"); done
mpi_flags+=(-x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && mpi_flags+=(-x LD_LIBRARY_PATH)  # mpirun warns about an unset one
# One rank per core group: keep torch's intra-op threads from oversubscribing the node.
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  threads=$(( $(nproc) / np )); [ "$threads" -ge 1 ] || threads=1
  mpi_flags+=(-x "OMP_NUM_THREADS=$threads")
fi
# Relative paths (--config, data, checkpoints) are the caller's: the working directory stays.

# Note [Stop signals through mpirun]: Open MPI's mpirun (4.1) forwards USR1, USR2, TSTP and CONT to
# the ranks, but answers INT, TERM and HUP by killing them (CONT, TERM 1 s later, KILL 1 s after
# that; exit 1 after ~2 s), too soon for a checkpoint. So mpirun runs in a session of its own, out
# of reach of a terminal's Ctrl-C (INT to the whole foreground process group; the ranks are each in
# a process group of their own already), and this script turns INT and TERM into USR1, which the
# trainer takes like TERM (src/train/run_guard.h): finish the step, save, exit 3.
# The job's stdin stays the script's (a background job's would be /dev/null); from a terminal
# mpirun no longer passes it to rank 0, which does not read it.
{ : <&0; } 2>/dev/null || exec </dev/null  # stdin closed: mpirun wants one
setsid mpirun "${mpi_flags[@]}" "$bin" "$@" <&0 &
job=$!
stops=0 woke=0
# The signal goes on first, then the message: stderr may be gone (a closed terminal, a `| tee` that
# the same Ctrl-C ended), and a write there must not end this script (PIPE ignored from here on;
# mpirun kept the default).
trap '' PIPE
say() { echo "train.sh: $*" >&2 2>/dev/null || true; }
stop() {
  stops=$((stops + 1))
  case "$stops" in
    1) kill -USR1 "$job" 2>/dev/null || true
       say "SIG$1: the ranks save a checkpoint after this step and stop (exit 3); SIG$1 again stops at once" ;;
    2) kill -TERM "$job" 2>/dev/null || true  # mpirun TERMs, then KILLs every rank
       say "SIG$1, a second stop signal: stopping the ranks now, without a checkpoint" ;;
    *) pkill -KILL -s "$job" 2>/dev/null || kill -KILL "$job" 2>/dev/null || true
       say "SIG$1, a third stop signal: killing mpirun and the ranks" ;;
  esac
}
forward() { kill "-$1" "$job" 2>/dev/null || true; }
trap 'woke=1; stop INT' INT
trap 'woke=1; stop TERM' TERM
# The rest as before, when mpirun got them itself: USR1 and USR2 (slurm/job.sh sends USR1 here) go to
# the ranks, HUP ends the job; Ctrl-Z (TSTP) stops the ranks and this script, and CONT (fg, bg)
# resumes them.
trap 'woke=1; forward USR1' USR1
trap 'woke=1; forward USR2' USR2
trap 'woke=1; forward HUP' HUP
trap 'woke=1; forward TSTP; kill -STOP $$' TSTP
trap 'woke=1; forward CONT' CONT
# A trapped signal ends `wait` early (status > 128) while mpirun runs on: wait again until the status
# is mpirun's own (a wait for a job already collected answers 127).
rc=""
while :; do
  woke=0
  r=0; wait "$job" || r=$?
  [ "$r" -eq 127 ] && [ -n "$rc" ] && break
  rc=$r
  [ "$woke" -eq 1 ] || break
done
exit "$rc"
