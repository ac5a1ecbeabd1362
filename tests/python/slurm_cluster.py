"""A real Slurm on this machine for the Slurm tests (test_slurm, test_slurm_multinode): munged,
slurmctld and one slurmd per node on a generated config in a temporary directory, and the tiny
CPU run both tests train and compare with an uninterrupted mpiexec run.

Several nodes on one host: every slurmd runs as `slurmd -N nK` with its own port, spool
directory, pid and log file (%n in slurm.conf), and its own TmpFS, where srun's PMIx plugin makes
each step's client directory (spmix_appdir_<uid>_<job>.<step>): under one /tmp the second node's
step fails with "File exists"."""
import json, os, pwd, re, shutil, signal, socket, subprocess, sys, tempfile, time
import numpy as np
from checks import check, failures, finish, write_tokens

SRC = os.path.abspath(os.environ.get("GPT2_SOURCE_DIR", "."))
BIN_DIR = os.path.abspath(os.environ.get("GPT2_BIN_DIR", "build/bin"))
BIN = os.path.join(BIN_DIR, "gpt2-train")
PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"  # the daemons live in sbin
TOOLS = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "squeue", "srun"]


def missing_tools():
    """The Slurm/MUNGE programs that are not installed (the tests skip when any is missing)."""
    return [t for t in TOOLS if not shutil.which(t, path=PATH)]


def run_test(prefix, run):
    """A Slurm test's frame: skip (77) without the programs, run(d) in a fresh temp dir, any
    exception a failure, the dir kept only when something failed, then the exit status."""
    missing = missing_tools()
    if missing:
        print(f"SKIP: Slurm/MUNGE not installed (missing {', '.join(missing)}); "
              "apt-get install slurmctld slurmd slurm-client munge (launch/install-deps.sh)")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix=prefix)
    t0 = time.time()
    try:
        run(d)
    except Exception as e:
        check(False, f"no exception ({type(e).__name__}: {e})")
    finally:
        print(f"total {time.time() - t0:.1f} s")
        if failures:
            print(f"(kept {d} for inspection)")
        else:
            shutil.rmtree(d, ignore_errors=True)
    finish()


def sh(*cmd, timeout=30, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    return p.returncode, (p.stdout + p.stderr).strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """munged + slurmctld + one slurmd per node (n1, n2, ...) on this machine, everything under `d`,
    SLURM_CONF exported. Each node offers `cpus` CPUs."""

    def __init__(self, d, nodes=1, cpus=2):
        self.d, self.procs, self.cpus = d, [], cpus
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [f"n{i + 1}" for i in range(nodes)]

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
        os.makedirs(os.path.join(d, "state"))
        for node in self.nodes:
            for sub in ("spool", "tmp"):
                os.makedirs(os.path.join(d, f"{sub}-{node}"))
        user = pwd.getpwuid(os.getuid()).pw_name
        node_lines = "".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={free_port()} "
                             f"CPUs={self.cpus} State=UNKNOWN\n" for n in self.nodes)
        # cred_expire also sets how long a requeued job waits before it may start (120 s by
        # default); sched_interval/bf_interval make the scheduler look at it soon after.
        conf = f"""ClusterName=gpt2test
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire=10
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
TmpFS={d}/tmp-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
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
# Slurm's default, stated because the tests time by it: a step that ends (a rank died, srun
# --kill-on-bad-exit) sends TERM to its tasks and KILL this long after.
KillWait=30
{node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(os.path.join(d, "slurm.conf"), "w") as f:
            f.write(conf)
        os.environ["SLURM_CONF"] = os.path.join(d, "slurm.conf")
        self.spawn("slurmctld", ["slurmctld", "-D"])
        for node in self.nodes:
            self.spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self.wait_for(lambda: sh("sinfo", "-h", "-N", "-o", "%T", "-n", ",".join(self.nodes))[1].split() ==
                      ["idle"] * len(self.nodes), 60, "the nodes idle in sinfo")

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

    def logs(self):
        """The daemons' logs, for a failure report."""
        return ["slurmctld.log"] + [f"slurmd-{n}.log" for n in self.nodes]

    def serve(self, work):
        """start(), work(), stop(): an exception is a failure, and a failure prints the daemons' logs."""
        try:
            t0 = time.time()
            self.start()
            print(f"cluster up in {time.time() - t0:.1f} s (nodes {', '.join(self.nodes)} on host {self.host})")
            work()
        except Exception as e:
            check(False, f"no exception ({type(e).__name__}: {e})")
        finally:
            self.stop()
            if failures:
                for name in self.logs():
                    print(f"--- {name}\n{self.tail(name)}")

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


def wait_job(job, cond, seconds, poll=0.2):
    """job_info(job) once cond(info) holds, or after `seconds`."""
    end = time.time() + seconds
    while time.time() < end:
        info = job_info(job)
        if cond(info):
            return info
        time.sleep(poll)
    return job_info(job)


def preempt(job, ckpt, log):
    """USR1 to the batch shell alone (what --signal=B:USR1@120 sends before the time limit), then
    the requeue: checks both and the log's lines for them. Returns (latest checkpoint's name, its
    step or -1, when the signal went)."""
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
    return saved, saved_step, t_sig


def check_resumed_run(job, log, metrics, ref, steps, saved_step, t_sig, t0, second_run_logs=("done:",)):
    """After preempt(): the requeued job completes; its second run logs each of `second_run_logs`
    and starts at the checkpoint's step; the metrics hold steps 0..steps-1 once each; and every
    step's loss equals the uninterrupted run's `ref` to 1e-5 relative. Returns the log's text."""
    # Slurm holds a requeued job back for a while (cred_expire, 10 s here), then it runs again.
    live = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", None)
    info = wait_job(job, lambda i: i.get("JobState") not in live, 420)
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          f"the requeued job completes ({info.get('JobState')}, ExitCode={info.get('ExitCode')}, "
          f"{time.time() - t_sig:.1f} s after the signal, {time.time() - t0:.1f} s after sbatch)")
    second = text.split("restart 1")[-1] if "restart 1" in text else ""
    check(all(s in second for s in second_run_logs), f"the second run logs {', '.join(second_run_logs)}")
    first_step = re.search(r"\] step (\d+)/\d+ \|", second)
    logged = [json.loads(l)["step"] for l in open(metrics) if '"loss"' in l] if os.path.exists(metrics) else []
    check(first_step is not None and int(first_step.group(1)) == saved_step and logged == list(range(steps)),
          f"the second run starts at the checkpoint's step ({first_step and first_step.group(1)}, saved "
          f"{saved_step}; metrics steps {logged[:1]}..{logged[-1:]}, {len(logged)} lines)")
    got = losses(metrics)
    common = [s for s in ref if s in got]
    worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in common), default=float("inf"))
    last = steps - 1
    check(len(common) == steps and worst <= 1e-5,
          f"the losses match the uninterrupted run: step {last} {got.get(last)} vs {ref.get(last)}; "
          f"worst relative difference over {len(common)} steps {worst:.1e}")
    return text


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


def tiny_config(d, ranks, steps, every):
    """A tiny CPU model on d/train.h5 (written here), `ranks` micro-batches of 8 per step; the path."""
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
batch_tokens = {ranks * 8 * 64}
max_steps = {steps}
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
every = {every}
[log]
every = 1
""")
    return cfg


def reference_run(d, cfg, ranks):
    """The same config uninterrupted, straight under mpiexec on this host: (returncode, step ->
    loss, seconds, output)."""
    mpi = ["mpiexec", "-n", str(ranks), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    t0 = time.time()
    p = subprocess.run(mpi + [BIN, "--config", cfg, f"--checkpoint.dir={d}/ckpt-ref",
                              f"--log.metrics={d}/ref.jsonl"], capture_output=True, text=True,
                       errors="replace", timeout=300, cwd=SRC)
    return p.returncode, losses(f"{d}/ref.jsonl"), time.time() - t0, p.stdout + p.stderr
