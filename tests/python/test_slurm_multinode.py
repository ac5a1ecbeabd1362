"""slurm/multinode.sbatch under a real two-node Slurm on this machine (munged, slurmctld, and two
slurmd started as nodes n1 and n2 with their own ports and spool directories; tests/python/
slurm_cluster.py), 2 nodes x 2 CPU ranks of a tiny model, one checkpoint directory both nodes see:

1. Placement: the log states 2 nodes, and each rank's node and node-local rank, which must be
   the launcher's own (SLURMD_NODENAME, and SLURM_LOCALID under srun or Open MPI's local rank
   under mpirun, read from each running rank's environment).
2. Preemption, through srun --mpi=pmix (what the script picks where Slurm has PMIx): USR1 to the
   batch shell mid-run -> every rank on both nodes saves at the next step (the checkpoint holds
   all 4 shards and verifies) -> the job requeues itself -> resumes from that checkpoint and ends
   with the losses of an uninterrupted mpiexec run (1e-5 relative).
3. A rank lost, through srun and through mpirun inside the allocation: kill -9 of one rank on n2
   -> the whole job ends within 60 s, no rank left running, and the last checkpoint passes
   `gpt2-ckpt verify`.

Open MPI's shared-memory transport names its segments by host name and node-local rank, so two
nodes on one host would share them: the job uses TCP over loopback between every pair of ranks,
as ranks on separate machines do. The daemons are always stopped. Exits 77 (skipped) only when
the Slurm or MUNGE programs are not installed. Run by CTest."""
import json, os, re, signal, time
from checks import check, failures
from slurm_cluster import BIN, BIN_DIR, PATH, SRC, Cluster, check_resumed_run, losses, preempt, reference_run, run_test, sh, \
    tiny_config, wait_job

NODES, PER_NODE = 2, 2
NP = NODES * PER_NODE
STEPS, EVERY, SIGNAL_AT = 60, 20, 10  # optimizer steps; checkpoint.every; USR1 once the metrics reach this step
KILL_WITHIN = 60  # s from kill -9 of one rank to the end of the job
LIVE = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", None)  # states that are not an end




def run(d):
    cfg = tiny_config(d, NP, STEPS, EVERY)
    os.environ["OMP_NUM_THREADS"] = "1"  # all runs alike (4 ranks on this machine's cores)

    rc, ref, seconds, out = reference_run(d, cfg, NP)
    check(rc == 0 and STEPS - 1 in ref, f"reference run under mpiexec -n {NP} (rc={rc}, {seconds:.1f} s)")
    if rc != 0:
        print(out[-3000:])
        return

    cluster = Cluster(d, nodes=NODES, cpus=PER_NODE)

    def work():
        preempt_and_resume(d, cfg, ref)
        for launcher in ("srun", "mpirun"):
            kill_one_rank(d, cfg, launcher)

    cluster.serve(work)


def submit(d, name, *args, launcher="auto"):
    """sbatch slurm/multinode.sbatch on 2 nodes x 2 CPU ranks; (job id or None, its log)."""
    log = f"{d}/{name}.out"
    env = dict(os.environ, PATH=PATH, GPT2_BIN=BIN, GPT2_LAUNCHER=launcher,
               OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo")
    # The #SBATCH lines ask for 8 GPUs per node; these nodes offer 2 CPUs each.
    rc, out = sh("sbatch", "--parsable", f"--nodes={NODES}", f"--ntasks-per-node={PER_NODE}", "--gpus-per-node=0",
                 "--cpus-per-task=1", f"--output={log}", os.path.join(SRC, "slurm/multinode.sbatch"),
                 *args, env=env)
    check(rc == 0 and out.isdigit(), f"sbatch slurm/multinode.sbatch ({name}) submits ({out})")
    return (out if rc == 0 and out.isdigit() else None), log


def read(path):
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def rank_processes(job):
    """pid -> environment of this job's gpt2-train processes (the ranks)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != os.path.realpath(BIN):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if env.get("SLURM_JOB_ID") == job:
            out[int(pid)] = env
    return out


def placement(text):
    """rank -> (node, node-local rank) from the trainer's "node n2 (2 of 2): rank 2 = local 0 (cpu), ..."
    lines of the last run in `text`, and the node count it states."""
    last = text.split("[slurm] job ")[-1]
    count = re.search(r"rank\(s\) on (\d+) node\(s\)", last)
    out = {}
    for node, line in re.findall(r"node (\S+) \(\d+ of \d+\): (.*)", last):
        for rank, local in re.findall(r"rank (\d+) = local (\d+)", line):
            out[int(rank)] = (node, int(local))
    return out, int(count.group(1)) if count else None


def launcher_view(env):
    """(rank, node, node-local rank) of a rank's process as its launcher set them: srun's task ids,
    or under mpirun Open MPI's (the SLURM_* ids there are those of mpirun's daemon on the node)."""
    rank = env.get("OMPI_COMM_WORLD_RANK", env.get("SLURM_PROCID", "-1"))
    local = env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("SLURM_LOCALID", "-1"))
    return int(rank), env.get("SLURMD_NODENAME"), int(local)


def check_placement(text, procs, what):
    got, nodes = placement(text)
    launched = {rank: (node, local) for rank, node, local in map(launcher_view, procs.values())}
    check(nodes == NODES and len(got) == NP and got == launched,
          f"{what}: the log states {nodes} node(s) and each rank's node and local rank {sorted(got.items())}; "
          f"the launcher placed them {sorted(launched.items())}")
    check(sorted(got.values()) == [(f"n{n + 1}", l) for n in range(NODES) for l in range(PER_NODE)],
          f"{what}: {PER_NODE} ranks on each node, local ranks 0..{PER_NODE - 1}")


def verify(path):
    rc, out = sh(os.path.join(BIN_DIR, "gpt2-ckpt"), "verify", path, timeout=120)
    return rc == 0 and out.startswith("OK"), out


def preempt_and_resume(d, cfg, ref):
    ckpt, metrics = f"{d}/ckpt", f"{d}/slurm.jsonl"
    job, log = submit(d, "preempt", "--config", cfg, f"--checkpoint.dir={ckpt}", f"--log.metrics={metrics}")
    if job is None:
        return
    t0 = time.time()
    info = wait_job(job, lambda i: max(losses(metrics), default=-1) >= SIGNAL_AT or i.get("JobState") not in
                    ("PENDING", "RUNNING", None), 180)
    procs = rank_processes(job)
    at = max(losses(metrics), default=-1)
    check(info.get("JobState") == "RUNNING" and info.get("NumNodes") == str(NODES) and at >= SIGNAL_AT,
          f"job {job} runs on {info.get('NodeList')} ({info.get('NumNodes')} nodes) and reaches step {SIGNAL_AT} "
          f"({info.get('JobState')}, step {at}, {time.time() - t0:.1f} s after sbatch)")
    text = read(log)
    check(f"{NP} rank(s) via srun" in text, "the script launches through srun --mpi=pmix: "
          + (re.findall(r"\[slurm\] job .*", text) or ["(no [slurm] line)"])[0])
    check_placement(text, procs, "first run")

    at = max(losses(metrics), default=-1)
    saved, saved_step, t_sig = preempt(job, ckpt, log)
    # The ranks stop after the step in progress: the metrics of step `at` (0-based) were out, so
    # the checkpoint holds step at+1 done (step_{at+2}) unless that step ended as the signal came.
    check(at + 1 <= saved_step <= at + 3 and saved_step < STEPS,
          f"the checkpoint is from the next step: latest = {saved or '(none)'}, metrics were at step {at}")
    manifest = os.path.join(ckpt, saved, "manifest.json")
    shards = sorted(s["rank"] for s in json.load(open(manifest))["shards"]) if os.path.isfile(manifest) else []
    ok, out = verify(os.path.join(ckpt, saved))
    check(shards == list(range(NP)) and ok, f"every rank on both nodes saved its shard (ranks {shards}); "
          f"gpt2-ckpt verify: {out.splitlines()[0] if out else '(nothing)'}")

    text = check_resumed_run(job, log, metrics, ref, STEPS, saved_step, t_sig, t0,
                             ("done:", f"{NP} rank(s) on {NODES} node(s)"))
    if failures:
        print(f"--- {log}\n{text[-5000:]}")


def kill_one_rank(d, cfg, launcher):
    """srun ends the step at once and the other ranks at KILL after KillWait (they take srun's TERM
    as a preemption, but their step cannot finish without the dead rank); mpirun kills them itself."""
    ckpt, metrics = f"{d}/ckpt-kill-{launcher}", f"{d}/kill-{launcher}.jsonl"
    every = 5
    job, log = submit(d, f"kill-{launcher}", "--config", cfg, f"--checkpoint.dir={ckpt}",
                      f"--checkpoint.every={every}", f"--log.metrics={metrics}", launcher=launcher)
    if job is None:
        return
    # Kill once a checkpoint is out and training goes on past it.
    latest = os.path.join(ckpt, "latest")
    info = wait_job(job, lambda i: (os.path.exists(latest) and max(losses(metrics), default=-1) >= every + 2)
                    or i.get("JobState") not in ("PENDING", "RUNNING", None), 180)
    procs = rank_processes(job)
    victims = sorted((launcher_view(e)[0], pid) for pid, e in procs.items() if e.get("SLURMD_NODENAME") == "n2")
    text = read(log)
    check(info.get("JobState") == "RUNNING" and len(procs) == NP and victims and f"rank(s) via {launcher}" in text,
          f"job {job} runs {len(procs)} ranks through {launcher}, {len(victims)} on n2, past its first "
          f"checkpoint ({info.get('JobState')}, step {max(losses(metrics), default=-1)})")
    if not victims:
        return
    check_placement(text, procs, f"under {launcher}")
    rank, pid = victims[-1]
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    info = wait_job(job, lambda i: i.get("JobState") not in LIVE, KILL_WITHIN + 60)
    took = time.time() - t_kill
    left = rank_processes(job)
    check(info.get("JobState") in ("FAILED", "CANCELLED", "NODE_FAIL") and took < KILL_WITHIN and not left,
          f"{launcher}: kill -9 of rank {rank} (pid {pid}) on n2 ends the job in {took:.1f} s (< {KILL_WITHIN}): "
          f"{info.get('JobState')}, ExitCode={info.get('ExitCode')}, ranks left {sorted(left)}")
    check(int(info.get("Restarts", 0)) == 0, f"a failed job is not requeued (Restarts={info.get('Restarts')})")
    saved = open(latest).read().strip() if os.path.exists(latest) else "(none)"
    ok, out = verify(ckpt)
    check(ok, f"{launcher}: the last checkpoint ({saved}) verifies: gpt2-ckpt verify {ckpt}: {out[-500:]}")
    if failures:
        print(f"--- {log}\n{read(log)[-5000:]}")


if __name__ == "__main__":
    run_test("gpt2-slurm2-", run)
