"""One rank failing ends the whole job: under mpiexec -n 2, rank 1 throws at step 3 (GPT2_FAULT_AT
test hook); every rank must be gone with a non-zero exit within 60 s and rank 1's error must be in
the log. The same when rank 1 hangs at step 3: the step watchdog ends it, and so does the collective
timeout (parallel.timeout_s), which CPU ranks have too. Also: launch/train.sh runs 2 CPU ranks to
completion. Run by CTest."""
import os, subprocess, tempfile, time
import numpy as np
from checks import check, failures, finish, write_tokens

SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
BIN = os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-train")

with tempfile.TemporaryDirectory() as d:
    train = os.path.join(d, "train.h5")
    write_tokens(train, np.arange(50000) * 7 % 251)
    args = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=256",
            "--model.block_size=32", f"--data.train={train}", "--data.val=none", "--train.micro_batch=2",
            "--train.seq_len=16", "--train.batch_tokens=64", "--train.max_steps=40", "--train.sample_tokens=0",
            "--train.device=cpu", "--precision.dtype=fp32", "--log.every=1", "--log.metrics=none"]
    mpi = ["mpiexec", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])

    def run_faulty(fault, extra=()):
        """The job under GPT2_FAULT_AT=fault, each --key=value of extra replacing the same key of args
        (options may appear only once): (exit code or None on timeout, log, seconds)."""
        keys = {e.split("=")[0] for e in extra}
        t0 = time.time()
        try:
            p = subprocess.run(mpi + [BIN] + [a for a in args if a.split("=")[0] not in keys] + list(extra),
                               capture_output=True, text=True, errors="replace",
                               env=dict(os.environ, GPT2_FAULT_AT=fault), timeout=120)
            return p.returncode, p.stdout + p.stderr, time.time() - t0
        except subprocess.TimeoutExpired:
            return None, "timeout", time.time() - t0

    rc, out, dt = run_faulty("1:3")
    check(rc is not None and rc != 0, f"job exits non-zero (rc={rc})")
    check(dt < 60, f"within 60 s ({dt:.1f} s)")
    check("[rank 1/2] [error] injected fault (GPT2_FAULT_AT) at step 3" in out, "rank 1's error is in the log")
    check("step 2/40" in out and "step 5/40" not in out, "the job stopped at the failing step")
    if failures: print(out[-3000:])

    # A rank that hangs (sleeps forever at step 3): the other one waits in a collective; the step
    # watchdog (parallel.step_timeout_s, 10 s here) ends it, and mpiexec ends the job.
    rc, out, dt = run_faulty("1:3:hang", ["--parallel.step_timeout_s=10"])
    check(rc is not None and rc != 0, f"a hung rank: the job exits non-zero (rc={rc})")
    check(dt < 60, f"within 60 s ({dt:.1f} s)")
    check("no training step finished for" in out, "the watchdog says why")
    if failures: print(out[-3000:])

    # The same hang caught by the collective timeout instead: rank 0's gradient reduction at step 3
    # is never joined, and after parallel.timeout_s (2 s here) it ends with the reason.
    rc, out, dt = run_faulty("1:3:hang", ["--parallel.timeout_s=2"])
    check(rc is not None and rc != 0, f"a hung rank, collective timeout: the job exits non-zero (rc={rc})")
    check(dt < 60, f"within 60 s ({dt:.1f} s)")
    check("[rank 0/2] [error] MPI all_reduce did not finish within 2 s of being issued (parallel.timeout_s)" in out,
          "the collective timeout says why")
    if failures: print(out[-3000:])

    # Rank-0-only work that outlasts parallel.timeout_s is no dead peer: rank 0's sample at step 5
    # takes 4 s longer (GPT2_FAULT_AT=0:5:stall) while the timeout is 2 s; the healthy job must finish.
    gpt2_train = os.path.join(d, "gpt2.h5")  # samples start from <|endoftext|>: the GPT-2 vocabulary
    write_tokens(gpt2_train, np.arange(50000) * 7 % 251, vocab=50257, eot=50256)
    rc, out, dt = run_faulty("0:5:stall", [f"--data.train={gpt2_train}", "--model.vocab_size=50257",
                                           f"--data.tokenizer_dir={os.path.join(SRC, 'data/tokenizer/gpt2')}",
                                           "--train.sample_every=5", "--train.sample_tokens=4",
                                           "--train.max_steps=8", "--parallel.timeout_s=2"])
    check(rc == 0 and "sample at step 5" in out and "step 7/8" in out,
          f"rank 0 busy 4 s alone with parallel.timeout_s = 2: the job still completes (rc={rc})")
    check("did not finish within" not in out, "no collective timed out")
    if rc != 0: print(out[-3000:])

    p = subprocess.run([os.path.join(SRC, "launch/train.sh"), "-np", "2"] + args, capture_output=True, text=True,
                       errors="replace", timeout=300, cwd=SRC)
    out = p.stdout + p.stderr
    check(p.returncode == 0 and "step 39/40" in out and "2 rank(s)" in out, f"launch/train.sh -np 2 trains (rc={p.returncode})")
    if p.returncode != 0: print(out[-3000:])

finish()
