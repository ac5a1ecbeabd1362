"""Stopping a run through launch/train.sh (CPU ranks, tiny model, no periodic checkpoint):
- SIGTERM to the script alone (-np 1), and SIGINT to its whole process group as a terminal's Ctrl-C
  sends it (-np 2): the ranks save a checkpoint at the next step and the script exits 3; the
  checkpoint passes `gpt2-ckpt verify`, and a resume (checkpoint.resume=auto) starts from it and
  finishes (exit 0);
- a second Ctrl-C stops at once: with rank 0 hung in a step (GPT2_FAULT_AT=0:3:hang), so that the
  first one cannot end the job, the job is still there 3 s after the first and gone, with no rank
  left, within 15 s of the second, exit neither 0 nor 3.
Before the script forwarded them, INT and TERM reached mpirun, which kills the ranks (TERM, then
KILL; exit 1 after ~2 s, a checkpoint only when a step and the save fit in the second between).
Run by CTest (label mpi)."""
import os, re, signal, subprocess, tempfile, threading, time
import numpy as np
from checks import check, failures, finish, tiny_train_args, write_tokens

SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
TRAIN_SH = os.path.join(SRC, "launch", "train.sh")
CKPT = os.path.join(BIN_DIR, "gpt2-ckpt")


class Job:
    """launch/train.sh in a session of its own (as a shell gives a foreground job its own process
    group), its output collected by a thread."""

    def __init__(self, np_, args, env=None):
        self.t0 = time.time()
        self.p = subprocess.Popen([TRAIN_SH, "-np", str(np_)] + args, cwd=SRC, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                  env=dict(os.environ, GPT2_BIN=os.path.join(BIN_DIR, "gpt2-train"), **(env or {})),
                                  start_new_session=True)
        self.chunks = []
        self.reader = threading.Thread(target=lambda: self.chunks.extend(self.p.stdout), daemon=True)
        self.reader.start()

    def out(self):
        return "".join(self.chunks)

    def wait_for_step(self, step, timeout=120):
        """True once the log shows `step N/` (N >= step) while the job runs."""
        end = time.time() + timeout
        while time.time() < end and self.p.poll() is None:
            if any(int(s) >= step for s in re.findall(r"step (\d+)/\d+ \|", self.out())):
                return True
            time.sleep(0.2)
        return False

    def signal(self, sig, group):
        try:
            (os.killpg if group else os.kill)(self.p.pid, sig)
        except ProcessLookupError:  # gone already
            pass

    def wait(self, timeout):
        """(exit code or None if still running after timeout, seconds since started)."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, time.time() - self.t0
        self.reader.join(10)
        return rc, time.time() - self.t0

    def kill(self):  # clean-up after a failure: the script's session, then any rank it left
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()


def processes_with(needle):
    """Pids whose command line contains needle (the job's temporary directory)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def kill_leftovers(needle):
    for pid in processes_with(needle):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


with tempfile.TemporaryDirectory() as d:
    train = os.path.join(d, "train.h5")
    write_tokens(train, np.arange(50000) * 7 % 251)

    def args(name, **over):
        return tiny_train_args(train, **{"model.n_embd": 64, "train.max_steps": 100000, "log.metrics": "none",
                                         "checkpoint.dir": os.path.join(d, name), "checkpoint.every": 100000,
                                         "checkpoint.resume": "auto", **over})

    def saved_steps(name):
        root = os.path.join(d, name)
        return sorted(int(s[5:]) for s in os.listdir(root) if re.fullmatch(r"step_\d+", s)) if os.path.isdir(root) else []

    # ---- one stop signal: save, exit 3, resume -----------------------------------------------------
    for name, np_, sig, group in [("term_script", 1, signal.SIGTERM, False), ("int_group", 2, signal.SIGINT, True)]:
        what = f"-np {np_}, {signal.Signals(sig).name} to {'the process group' if group else 'the script'}"
        job = Job(np_, args(name))
        check(job.wait_for_step(3), f"{what}: the job trains (step 3 in the log)")
        job.signal(sig, group)
        rc, dt = job.wait(120)
        if rc is None: job.kill()
        out = job.out()
        check(rc == 3, f"{what}: exit 3 after the save (rc={rc}, {dt:.1f} s after the start)")
        check("preempted by signal 10" in out, f"{what}: the ranks stopped for USR1, which the script sent")
        steps = saved_steps(name)
        check(len(steps) == 1 and steps[0] >= 4, f"{what}: one checkpoint, after step 3: {steps}")
        # The summary names the steps that ran (it said "steps 0-0" when the last logged loss was step 0).
        if steps:
            check(f"stopped (preempted): steps 0-{steps[0] - 1} of 100000" in out,
                  f"{what}: the summary names steps 0-{steps[0] - 1}: {[l for l in out.splitlines() if 'stopped' in l]}")
            step_dir = os.path.join(d, name, f"step_{steps[0]:07d}")
            v = subprocess.run([CKPT, "verify", step_dir], capture_output=True, text=True, errors="replace")
            check(v.returncode == 0 and v.stdout.startswith("OK"), f"{what}: gpt2-ckpt verify: {v.stdout.strip()[:200]}")
            more = args(name, **{"train.max_steps": steps[0] + 3})
            job2 = Job(np_, more)
            rc2, _ = job2.wait(300)
            if rc2 is None: job2.kill()
            m = re.search(r"resumed from \S+/step_(\d+) at step (\d+)", job2.out())
            check(rc2 == 0 and m is not None and int(m.group(2)) == steps[0],
                  f"{what}: the resume starts at step {steps[0]} and finishes (rc={rc2}, {m.group(0) if m else 'no resume line'})")
            if rc2 != 0: print(job2.out()[-3000:])
        if failures: print(out[-3000:])
        kill_leftovers(os.path.join(d, name))

    # ---- a second Ctrl-C stops at once -------------------------------------------------------------
    name = "twice"
    job = Job(2, args(name), env={"GPT2_FAULT_AT": "0:3:hang"})
    check(job.wait_for_step(2), "hung job: it trains (step 2 in the log)")
    time.sleep(1)  # into the hang at step 3
    job.signal(signal.SIGINT, True)
    rc, _ = job.wait(3)
    check(rc is None, f"hung job: still running 3 s after the first Ctrl-C, which waits for the step (rc={rc})")
    t1 = time.time()
    job.signal(signal.SIGINT, True)
    rc, _ = job.wait(15)
    dt = time.time() - t1
    if rc is None: job.kill()
    check(rc not in (None, 0, 3), f"hung job: the second Ctrl-C ends it within 15 s (rc={rc}, {dt:.1f} s)")
    time.sleep(0.5)
    left = processes_with(os.path.join(d, name))
    check(not left, f"hung job: no rank or mpirun left ({left})")
    check(saved_steps(name) == [], f"hung job: no checkpoint ({saved_steps(name)})")
    if failures: print(job.out()[-3000:])
    kill_leftovers(os.path.join(d, name))

finish()
