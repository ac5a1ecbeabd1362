"""slurm/train.sbatch under a real Slurm: a one-node cluster of this machine (munged, slurmctld and
slurmd on a generated config in a temp dir), a tiny CPU model on 2 ranks, USR1 to the batch shell
mid-run (what --signal=B:USR1@120 does before the time limit). The ranks must save a checkpoint and
exit 3, the script must requeue the job, and the requeued job must resume from the checkpoint and
end with the loss of an uninterrupted mpiexec run (1e-5 relative). The daemons are always stopped.
Exits 77 (skipped) only when the Slurm or MUNGE programs are not installed
(apt-get install slurmctld slurmd slurm-client munge). Run by CTest."""
import json, os, re, shutil, sys, tempfile, time
from checks import check, failures, finish
from slurm_cluster import BIN, PATH, SRC, Cluster, losses, missing_tools, reference_run, sh, tiny_config, \
    wait_job

NP, STEPS, SIGNAL_AT = 2, 80, 10  # ranks; optimizer steps; USR1 once the metrics reach this step


def main():
    missing = missing_tools()
    if missing:
        print(f"SKIP: Slurm/MUNGE not installed (missing {', '.join(missing)}); "
              "apt-get install slurmctld slurmd slurm-client munge (launch/install-deps.sh)")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix="gpt2-slurm-")
    try:
        run(d)
    except Exception as e:
        check(False, f"no exception ({type(e).__name__}: {e})")
    finally:
        if failures:
            print(f"(kept {d} for inspection)")
        else:
            shutil.rmtree(d, ignore_errors=True)
    finish()


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
    try:
        t0 = time.time()
        cluster.start()
        print(f"cluster up in {time.time() - t0:.1f} s (node {cluster.nodes[0]})")
        slurm_run(d, cfg, ref)
    except Exception as e:
        check(False, f"no exception ({type(e).__name__}: {e})")
    finally:
        cluster.stop()
        if failures:
            for name in cluster.logs():
                print(f"--- {name}\n{cluster.tail(name)}")


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
    rc, out = sh("scancel", "--signal=USR1", "--batch", job)
    check(rc == 0, f"scancel --signal=USR1 --batch {job} ({out or 'ok'})")
    t_sig = time.time()

    info = wait_job(job, lambda i: int(i.get("Restarts", 0)) >= 1, 120)
    latest = os.path.join(ckpt, "latest")
    saved = open(latest).read().strip() if os.path.exists(latest) else ""
    saved_step = int(saved[5:]) if saved.startswith("step_") and saved[5:].isdigit() else -1
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    check(int(info.get("Restarts", 0)) == 1, f"the job was requeued (Restarts={info.get('Restarts')}, "
          f"{info.get('JobState')}, {time.time() - t_sig:.1f} s after the signal)")
    check("preempted" in text and "requeueing job" in text, "the log says preempted, then requeueing")
    check(SIGNAL_AT < saved_step < STEPS and os.path.isfile(os.path.join(ckpt, saved, "manifest.json")),
          f"a checkpoint from mid-run: latest = {saved or '(none)'}")

    # Slurm holds a requeued job back for a while (cred_expire, 10 s here), then it runs again.
    info = wait_job(job, lambda i: i.get("JobState") not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", None), 420)
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          f"the requeued job completes ({info.get('JobState')}, ExitCode={info.get('ExitCode')}, "
          f"{time.time() - t_sig:.1f} s after the signal, {time.time() - t0:.1f} s after sbatch)")
    check("restart 1" in text and "done:" in text.split("restart 1")[-1], "the second run logs done:")
    # Every step logged once: the first run up to the checkpoint, the second from it on.
    second = text.split("restart 1")[-1]
    first_step = re.search(r"\] step (\d+)/\d+ \|", second)
    steps = [json.loads(l)["step"] for l in open(metrics) if '"loss"' in l] if os.path.exists(metrics) else []
    check(first_step is not None and int(first_step.group(1)) == saved_step and steps == list(range(STEPS)),
          f"the second run starts at the checkpoint's step ({first_step and first_step.group(1)}, saved "
          f"{saved_step}; metrics steps {steps[:1]}..{steps[-1:]}, {len(steps)} lines)")

    got = losses(metrics)
    last = STEPS - 1
    a, b = got.get(last), ref.get(last)
    rel = abs(a - b) / abs(b) if a is not None and b else float("inf")
    common = [s for s in ref if s in got]
    worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in common), default=float("inf"))
    check(rel <= 1e-5, f"final loss matches the uninterrupted run: {a} vs {b} (rel {rel:.1e}; "
          f"worst over {len(common)} steps {worst:.1e})")
    if failures:
        print(f"--- {log}\n{text[-4000:]}")


if __name__ == "__main__":
    main()
