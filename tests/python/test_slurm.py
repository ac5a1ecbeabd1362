"""slurm/train.sbatch under a real Slurm: a one-node cluster of this machine (munged, slurmctld and
slurmd on a generated config in a temp dir), a tiny CPU model on 2 ranks, USR1 to the batch shell
mid-run (what --signal=B:USR1@120 does before the time limit). The ranks must save a checkpoint and
exit 3, the script must requeue the job, and the requeued job must resume from the checkpoint and
end with the loss of an uninterrupted mpiexec run (1e-5 relative). The daemons are always stopped.
Exits 77 (skipped) only when the Slurm or MUNGE programs are not installed
(apt-get install slurmctld slurmd slurm-client munge). Run by CTest."""
import json, os, pwd, re, shutil, signal, socket, subprocess, sys, tempfile, time
import numpy as np
from checks import check, failures, finish, write_tokens

SRC = os.path.abspath(os.environ.get("GPT2_SOURCE_DIR", "."))
BIN = os.path.abspath(os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-train"))
PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"  # the daemons live in sbin
TOOLS = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "squeue", "srun"]
NP, STEPS, SIGNAL_AT = 2, 80, 10  # ranks; optimizer steps; USR1 once the metrics reach this step


def sh(*cmd, timeout=30, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    return p.returncode, (p.stdout + p.stderr).strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """munged + slurmctld + slurmd for this machine, everything under `d`, SLURM_CONF exported."""

    def __init__(self, d):
        self.d, self.procs, self.node = d, [], socket.gethostname().split(".")[0]

    def start(self):
        d = self.d
        os.chmod(d, 0o755)  # munged wants its socket's directories searchable by everyone
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        sock = os.path.join(d, "munge.sock")
        self.spawn("munged", ["munged", "-F", f"--socket={sock}", f"--key-file={key}",
                              f"--log-file={d}/munged.log", f"--pid-file={d}/munged.pid",
                              f"--seed-file={d}/munged.seed"])
        self.wait_for(lambda: os.path.exists(sock), 20, "munged's socket")
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(d, sub))
        user = pwd.getpwuid(os.getuid()).pw_name
        # cred_expire also sets how long a requeued job waits before it may start (120 s by
        # default); sched_interval/bf_interval make the scheduler look at it soon after.
        conf = f"""ClusterName=gpt2test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire=10
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=120
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={max(NP, os.cpu_count() or 1)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(os.path.join(d, "slurm.conf"), "w") as f:
            f.write(conf)
        os.environ["SLURM_CONF"] = os.path.join(d, "slurm.conf")
        self.spawn("slurmctld", ["slurmctld", "-D"])
        self.spawn("slurmd", ["slurmd", "-D", "-N", self.node])
        self.wait_for(lambda: sh("sinfo", "-h", "-o", "%T", "-n", self.node)[1] == "idle", 60,
                      "the node idle in sinfo")

    def spawn(self, name, cmd):
        log = open(os.path.join(self.d, name + ".out"), "w")
        self.procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                  env=dict(os.environ, PATH=PATH))))

    def wait_for(self, cond, seconds, what):
        end = time.time() + seconds
        while time.time() < end:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}: {self.tail(name + '.out')}")
            if cond():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}")

    def tail(self, name, n=3000):
        path = os.path.join(self.d, name)
        return open(path, errors="replace").read()[-n:] if os.path.exists(path) else "(no " + name + ")"

    def stop(self):
        """Cancel what still runs, then stop the daemons (newest first); never raises."""
        try:
            if all(p.poll() is None for _, p in self.procs):
                sh("scancel", "-u", pwd.getpwuid(os.getuid()).pw_name)
                end = time.time() + 40  # KillWait (30 s) after the TERM
                while time.time() < end and sh("squeue", "-h") != (0, ""):
                    time.sleep(1)
        except Exception as e:
            print("teardown:", e)
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def job_info(job):
    rc, out = sh("scontrol", "-o", "show", "job", str(job))
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv) if rc == 0 else {}


def losses(path):
    """step -> loss of the last line for that step (a resumed run appends)."""
    out = {}
    for line in open(path) if os.path.exists(path) else []:
        try:
            m = json.loads(line)
        except ValueError:  # a line being written
            continue
        if "loss" in m:
            out[m["step"]] = m["loss"]
    return out


def token_file(path, n):
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 250, size=rng.integers(5, 12)) for _ in range(40)]
    out = []
    while len(out) < n:
        out.extend(sentences[rng.integers(0, len(sentences))]); out.append(255)
    write_tokens(path, out[:n])


def main():
    missing = [t for t in TOOLS if not shutil.which(t, path=PATH)]
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
    token_file(os.path.join(d, "train.h5"), 100000)
    cfg = os.path.join(d, "tiny.ini")
    with open(cfg, "w") as f:
        f.write(f"""[model]
n_layer = 4
n_head = 4
n_embd = 128
vocab_size = 256
block_size = 64
[data]
train = {d}/train.h5
val = none
[train]
micro_batch = 8
seq_len = 64
batch_tokens = {NP * 8 * 64}
max_steps = {STEPS}
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
seed = 1337
sample_every = 0
sample_tokens = 0
device = cpu
[precision]
dtype = fp32
[checkpoint]
every = 25
[log]
every = 1
""")
    os.environ["OMP_NUM_THREADS"] = "1"  # both runs alike (and 2 ranks on 2 cores)

    # The reference: the same config, uninterrupted, straight under mpiexec.
    mpi = ["mpiexec", "-n", str(NP), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    t0 = time.time()
    p = subprocess.run(mpi + [BIN, "--config", cfg, f"--checkpoint.dir={d}/ckpt-ref",
                              f"--log.metrics={d}/ref.jsonl"], capture_output=True, text=True,
                       errors="replace", timeout=300, cwd=SRC)
    ref = losses(f"{d}/ref.jsonl")
    check(p.returncode == 0 and STEPS - 1 in ref, f"reference run under mpiexec (rc={p.returncode}, "
          f"{time.time() - t0:.1f} s)")
    if p.returncode != 0:
        print((p.stdout + p.stderr)[-3000:])
        return

    cluster = Cluster(d)
    try:
        t0 = time.time()
        cluster.start()
        print(f"cluster up in {time.time() - t0:.1f} s (node {cluster.node})")
        slurm_run(d, cfg, ref)
    except Exception as e:
        check(False, f"no exception ({type(e).__name__}: {e})")
    finally:
        cluster.stop()
        if failures:
            for name in ("slurmctld.log", "slurmd.log"):
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

    def wait(cond, seconds):
        end = time.time() + seconds
        while time.time() < end:
            info = job_info(job)
            if cond(info):
                return info
            time.sleep(0.2)
        return job_info(job)

    # Signal the batch shell alone, as --signal=B:USR1@120 does before the time limit.
    info = wait(lambda i: max(losses(metrics), default=-1) >= SIGNAL_AT or i.get("JobState") not in
                ("PENDING", "RUNNING", None), 120)
    at = max(losses(metrics), default=-1)
    check(info.get("JobState") == "RUNNING" and at >= SIGNAL_AT,
          f"job {job} runs and reaches step {SIGNAL_AT} ({info.get('JobState')}, step {at}, {time.time() - t0:.1f} s)")
    rc, out = sh("scancel", "--signal=USR1", "--batch", job)
    check(rc == 0, f"scancel --signal=USR1 --batch {job} ({out or 'ok'})")
    t_sig = time.time()

    info = wait(lambda i: int(i.get("Restarts", 0)) >= 1, 120)
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
    info = wait(lambda i: i.get("JobState") not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", None), 420)
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
