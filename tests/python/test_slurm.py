"""slurm/train.sbatch under a real Slurm: a one-node cluster of this machine (munged, slurmctld and
slurmd on a generated config in a temp dir), a tiny CPU model on 2 ranks, USR1 to the batch shell
mid-run (what --signal=B:USR1@120 does before the time limit). The ranks must save a checkpoint and
exit 3, the script must requeue the job, and the requeued job must resume from the checkpoint and
end with the loss of an uninterrupted mpiexec run (1e-5 relative). The daemons are always stopped.
Exits 77 (skipped) only when the Slurm or MUNGE programs are not installed
(apt-get install slurmctld slurmd slurm-client munge). Run by CTest."""
import os, time
from checks import check, failures
from slurm_cluster import BIN, PATH, SRC, Cluster, check_resumed_run, losses, preempt, reference_run, run_test, sh, \
    tiny_config, wait_job

NP, STEPS, SIGNAL_AT = 2, 80, 10  # ranks; optimizer steps; USR1 once the metrics reach this step




def run(d):
    cfg = tiny_config(d, NP, STEPS, every=25)
    os.environ["OMP_NUM_THREADS"] = "1"  # both runs alike (and 2 ranks on 2 cores)

    # The reference: the same config, uninterrupted, straight under mpiexec.
    rc, ref, seconds, out = reference_run(d, cfg, NP)
    check(rc == 0 and STEPS - 1 in ref, f"reference run under mpiexec (rc={rc}, {seconds:.1f} s)")
    if rc != 0:
        print(out[-3000:])
        return

    cluster = Cluster(d, nodes=1, cpus=max(NP, os.cpu_count() or 1))
    cluster.serve(lambda: slurm_run(d, cfg, ref))


def slurm_run(d, cfg, ref):
    ckpt, metrics, log = f"{d}/ckpt", f"{d}/slurm.jsonl", f"{d}/job.out"
    env = dict(os.environ, PATH=PATH, GPT2_BIN=BIN)
    # The #SBATCH lines ask for 8 GPUs; this machine offers NP CPUs.
    rc, out = sh("sbatch", "--parsable", "--gpus-per-node=0", f"--ntasks-per-node={NP}", "--cpus-per-task=1",
                 f"--output={log}", os.path.join(SRC, "slurm/train.sbatch"), "--config", cfg,
                 f"--checkpoint.dir={ckpt}", f"--log.metrics={metrics}", env=env)
    check(rc == 0 and out.isdigit(), f"sbatch slurm/train.sbatch submits ({out})")
    if rc != 0:
        return
    job, t0 = out, time.time()

    # Signal the batch shell alone, as --signal=B:USR1@120 does before the time limit.
    info = wait_job(job, lambda i: max(losses(metrics), default=-1) >= SIGNAL_AT or i.get("JobState") not in
                ("PENDING", "RUNNING", None), 120)
    at = max(losses(metrics), default=-1)
    check(info.get("JobState") == "RUNNING" and at >= SIGNAL_AT,
          f"job {job} runs and reaches step {SIGNAL_AT} ({info.get('JobState')}, step {at}, {time.time() - t0:.1f} s)")
    saved, saved_step, t_sig = preempt(job, ckpt, log)
    check(SIGNAL_AT < saved_step < STEPS and os.path.isfile(os.path.join(ckpt, saved, "manifest.json")),
          f"a checkpoint from mid-run: latest = {saved or '(none)'}")

    text = check_resumed_run(job, log, metrics, ref, STEPS, saved_step, t_sig, t0)
    if failures:
        print(f"--- {log}\n{text[-4000:]}")


if __name__ == "__main__":
    run_test("gpt2-slurm-", run)
