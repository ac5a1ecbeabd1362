"""Checkpoints survive faults (mpiexec -n 2, CPU ranks, tiny model, a checkpoint every 5 steps):
- a rank killed with SIGKILL at step 12 ends the whole job with a non-zero exit within 60 s, and a
  resume from the last checkpoint (step 10) finishes with exactly the uninterrupted run's loss;
- a rank killed at each of the 10 points of the save of step 10 (GPT2_CKPT_FAULT test hook; points
  1-4 on rank 1, 1-10 on rank 0): the resume starts from step 10 when that checkpoint was complete
  (renamed) before the kill and from step 5 otherwise, never from a partial one, and again ends
  with the uninterrupted run's loss. Run by CTest (label slow)."""
import json, os, re, subprocess, tempfile, time
import numpy as np
from checks import check, failures, finish, tiny_train_args, write_tokens

BIN = os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-train")
MPI = ["mpiexec", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def run(args, env=None, timeout=120):
    t0 = time.time()
    try:
        p = subprocess.run(MPI + [BIN] + args, capture_output=True, text=True, errors="replace",
                           env=dict(os.environ, **(env or {})), timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return None, "timeout", time.time() - t0


def final_loss(metrics):
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    return rows[-1]["step"], rows[-1]["loss"]


def resumed_step(out):
    m = re.search(r"resumed from \S+/step_(\d+) at step (\d+)", out)
    return int(m.group(2)) if m else 0


with tempfile.TemporaryDirectory() as d:
    train = os.path.join(d, "train.h5")
    write_tokens(train, np.arange(50000) * 7 % 251)

    def args(name, **over):
        return tiny_train_args(train, **{"train.max_steps": 20, "parallel.zero_stage": 1,
                                         "log.metrics": os.path.join(d, name + ".jsonl"),
                                         "checkpoint.dir": os.path.join(d, name), "checkpoint.every": 5,
                                         "checkpoint.resume": "auto", **over})

    rc, out, _ = run(args("straight"))
    check(rc == 0, f"uninterrupted run (rc={rc})")
    want = final_loss(os.path.join(d, "straight.jsonl"))
    check(want[0] == 19, f"it logs step 19 ({want})")

    # A rank vanishes mid-run.
    rc, out, dt = run(args("killed"), env={"GPT2_FAULT_AT": "1:12:kill"})
    check(rc not in (None, 0) and dt < 60, f"SIGKILL of rank 1 at step 12 ends the job: rc={rc} in {dt:.1f} s")
    check(os.path.isdir(os.path.join(d, "killed", "step_0000010")), "step 10 was saved before the kill")
    rc, out, _ = run(args("killed"))
    got = final_loss(os.path.join(d, "killed.jsonl"))
    check(rc == 0 and resumed_step(out) == 10, f"resume after the kill starts at step 10 (rc={rc}, {resumed_step(out)})")
    check(got == want, f"and ends with the uninterrupted loss ({got} vs {want})")
    if failures: print(out[-3000:])

    # A rank dies at each point of the save of step 10.
    cases = [(1, p) for p in range(1, 5)] + [(0, p) for p in range(1, 11)]
    for rank, point in cases:
        name = f"save_r{rank}_p{point}"
        rc, out, dt = run(args(name), env={"GPT2_CKPT_FAULT": f"{rank}:{point}:10"})
        check(rc not in (None, 0) and dt < 60, f"rank {rank} killed at save point {point}: job ends (rc={rc}, {dt:.1f} s)")
        complete = os.path.isfile(os.path.join(d, name, "step_0000010", "manifest.json"))
        expect = 10 if point >= 8 else 5  # the directory is renamed between points 7 and 8
        check(complete == (point >= 8), f"  step 10 complete after the kill: {complete}")
        rc, out2, _ = run(args(name))
        got = final_loss(os.path.join(d, name + ".jsonl"))
        check(rc == 0 and resumed_step(out2) == expect,
              f"  resume starts at step {expect} (rc={rc}, started at {resumed_step(out2)})")
        check(got == want, f"  and ends with the uninterrupted loss ({got[1]} vs {want[1]})")
        check(not os.path.exists(os.path.join(d, name, "step_0000010.tmp")), "  no partial directory is left")
        if rc != 0: print(out2[-2000:])
finish()
