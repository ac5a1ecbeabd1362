"""Checkpoints on a full disk and in damaged checkpoint directories (gpt2-train on CPU, tiny model,
one rank; gpt2-ckpt verify on the root):
- a full disk (a tmpfs sized to hold one checkpoint and a half, then filled up) and a write that
  fails half-way inside HDF5 (a file size limit): exit 2 with one error line that names the shard
  file and the OS error, no HDF5 error stack and no "infinite loop", no step_*.tmp left behind,
  and the earlier checkpoint still verifies and resumes;
- a step directory whose manifest.json was deleted: the resume warns naming it, takes the step
  before, and saves that step again over it (no "Directory not empty"); `gpt2-ckpt verify ROOT`
  lists every step directory and `latest`, and fails while one is damaged;
- empty step directories older than the newest checkpoint (a kill during rotation) and stale .tmp
  directories are removed at the next start.
The tmpfs needs a mount namespace (unshare -m as root, unshare -rm otherwise); where neither is
allowed the full-disk part is skipped and said so. Run by CTest."""
import os, re, shutil, subprocess, sys, tempfile
import numpy as np
from checks import check, finish, tiny_train_args, write_tokens

BIN = os.environ.get("GPT2_BIN_DIR", "build/bin")
TRAIN, CKPT = os.path.join(BIN, "gpt2-train"), os.path.join(BIN, "gpt2-ckpt")


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def args(d, ckpt, steps, every, **over):
    return [TRAIN] + tiny_train_args(os.path.join(d, "train.h5"), **{
        "model.n_embd": 64, "train.batch_tokens": 32, "train.max_steps": steps, "log.metrics": "none",
        "checkpoint.dir": ckpt, "checkpoint.every": every, "checkpoint.resume": "auto", "checkpoint.keep": 5, **over})


def error_lines(out):
    return [l for l in out.splitlines() if "[error]" in l]


def full_disk_part(d):
    """Runs inside a private mount namespace with a tmpfs at d/full."""
    full = os.path.join(d, "full")
    # One checkpoint's size, measured on the ordinary disk.
    probe = os.path.join(d, "probe")
    rc, out = run(args(d, probe, 2, 2))
    shard = os.path.join(probe, "step_0000002", "optim_r00000.h5")
    size = os.path.getsize(shard) if rc == 0 and os.path.exists(shard) else 0
    check(size > 100000, f"a checkpoint shard is {size} bytes")
    os.makedirs(full)
    kib = int(size * 1.5) // 1024
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", full]).returncode == 0
    check(mounted, f"a {kib} KiB tmpfs is mounted at {full}")
    if not mounted: return
    ckpt = os.path.join(full, "ckpt")
    # Mid-save: step 2 fits, step 4 runs out of space half-way through its shard.
    rc, out = run(args(d, ckpt, 6, 2))
    errors = error_lines(out)
    check(rc == 2, f"full disk mid-save: exit 2 (rc={rc})")
    want = re.compile(r"checkpoint of step 4: cannot write \S*step_0000004\.tmp/optim_r00000\.h5: No space left on device")
    check(len(errors) == 1 and want.search(errors[0]) is not None, f"one error line naming the shard and the OS error: {errors}")
    check("infinite loop" not in out and "H5Dwrite" not in out and "HDF5-DIAG" not in out, "no HDF5 noise")
    if rc != 2 or len(errors) != 1: print(out[-2500:])
    check(sorted(os.listdir(ckpt)) == ["latest", "step_0000002"], f"no .tmp left: {sorted(os.listdir(ckpt))}")
    rc, out = run([CKPT, "verify", os.path.join(ckpt, "step_0000002")])
    check(rc == 0 and out.startswith("OK"), f"step 2 verifies: {out.strip()[-200:]}")
    # At create time: the disk is full before the save starts.
    with open(os.path.join(full, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    rc, out = run(args(d, ckpt, 6, 2))
    errors = error_lines(out)
    check(rc == 2 and len(errors) == 1 and "No space left on device" in errors[0] and "step_0000004" in errors[0],
          f"full disk at create time: exit 2, one line naming the step and the OS error (rc={rc}): {errors}")
    check("infinite loop" not in out and "HDF5-DIAG" not in out, "no HDF5 noise at exit")
    if rc != 2 or len(errors) != 1: print(out[-2500:])
    check(not [n for n in os.listdir(ckpt) if n.endswith(".tmp")], f"no .tmp left: {sorted(os.listdir(ckpt))}")
    # Space again (for a run that saves nothing more): it resumes from step 2 and finishes.
    os.remove(os.path.join(full, "filler"))
    rc, out = run(args(d, ckpt, 4, 0))
    check(rc == 0 and "resumed from" in out and "step_0000002" in out, f"resumes from step 2 once there is room (rc={rc})")
    subprocess.run(["umount", full])


def failed_write_part(d):
    """A write that fails inside HDF5, half-way (a file size limit: EFBIG, as a disk filling up under
    the writer would give ENOSPC): the same one line, and nothing of HDF5's at exit."""
    import resource, signal
    ckpt = os.path.join(d, "limited")
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write(2) returns EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))  # above MPI's own files
    # Width 256: a shard of 20 MB, which the limit cuts.
    p = subprocess.run(args(d, ckpt, 4, 2, **{"model.n_embd": 256}), capture_output=True, text=True, errors="replace", timeout=300,
                       preexec_fn=limit)
    out, errors = p.stdout + p.stderr, error_lines(p.stdout + p.stderr)
    want = re.compile(r"checkpoint of step 2: cannot write \S*step_0000002\.tmp/optim_r00000\.h5: File too large")
    check(p.returncode == 2 and len(errors) == 1 and want.search(errors[0]) is not None,
          f"a write failing half-way: exit 2, one line naming the shard and the OS error (rc={p.returncode}): {errors}")
    check("infinite loop" not in out and "HDF5-DIAG" not in out, "no HDF5 noise at exit")
    if len(errors) != 1 or "infinite loop" in out: print(out[-2500:])
    check(not os.path.exists(ckpt) or not [n for n in os.listdir(ckpt) if n.startswith("step_")],
          f"nothing of the failed save is left: {os.listdir(ckpt) if os.path.exists(ckpt) else []}")


def damaged_part(d):
    ckpt = os.path.join(d, "damaged")
    rc, _ = run(args(d, ckpt, 6, 2))
    check(rc == 0 and sorted(os.listdir(ckpt)) == ["latest", "step_0000002", "step_0000004", "step_0000006"],
          f"three checkpoints: {sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else rc}")
    os.remove(os.path.join(ckpt, "step_0000006", "manifest.json"))
    rc, out = run([CKPT, "verify", ckpt])
    check(rc == 1, f"verify ROOT fails while a step directory is damaged (rc={rc})")
    for needle in ["OK step_0000002", "OK step_0000004", "DAMAGED step_0000006", "latest names step_0000006"]:
        check(needle in out, f"verify ROOT reports {needle!r}: {out.strip()}")
    # Two ranks see the same directory: rank 0 alone warns (with "rank 0/2").
    mpi = ["mpiexec", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    rc, out = run(mpi + args(d, ckpt, 6, 0, **{"train.batch_tokens": 64}))
    warned = [l for l in out.splitlines() if "[warning]" in l and "no manifest.json" in l]
    check(rc == 0 and len(warned) == 1 and "rank 0/2" in warned[0], f"2 ranks: one warning, from rank 0: {warned}")
    if len(warned) != 1: print(out[-3000:])
    rc, out = run(args(d, ckpt, 8, 2))
    check(rc == 0, f"the run resumes past the damaged step and saves over it (rc={rc})")
    if rc != 0: print(out[-2500:])
    warned = [l for l in out.splitlines() if "[warning]" in l and "step_0000006" in l]
    check(any("no manifest.json" in l and "skipped" in l for l in warned), f"the resume warns naming it: {warned}")
    check("resumed from" in out and "step_0000004" in out, "it resumes from step 4")
    rc, out = run([CKPT, "verify", ckpt])
    check(rc == 0 and "OK step_0000006" in out and "OK step_0000008" in out, f"verify ROOT passes again: {out.strip()}")
    # A manifest that contradicts itself (its shard leaves the end of the flat space uncovered) is
    # refused by resume with the verifier's words, before any shard is read.
    import json
    bad = os.path.join(d, "bad_manifest")
    shutil.copytree(os.path.join(ckpt, "step_0000008"), os.path.join(bad, "step_0000008"))
    mf = os.path.join(bad, "step_0000008", "manifest.json")
    m = json.load(open(mf))
    m["shards"][0]["end"] -= 2048
    json.dump(m, open(mf, "w"))
    rc, out = run(args(d, bad, 10, 2))
    check(rc == 2 and "is damaged, nothing was loaded" in out and "is in no shard (gap at the end)" in out,
          f"resume refuses a manifest whose shards leave a gap (rc={rc}): {error_lines(out)}")
    # Leftovers of kills: an empty older step directory (rotation) and a stale .tmp.
    os.makedirs(os.path.join(ckpt, "step_0000001"))
    os.makedirs(os.path.join(ckpt, "step_0000009.tmp"))
    rc, out = run(args(d, ckpt, 10, 2))
    left = sorted(os.listdir(ckpt))
    check(rc == 0 and "step_0000001" not in left and "step_0000009.tmp" not in left,
          f"leftovers removed at the next start: {left}")


if sys.argv[1:] == ["--full-disk"]:  # inside the mount namespace
    print("full-disk part running", flush=True)
    with tempfile.TemporaryDirectory() as d:
        write_tokens(os.path.join(d, "train.h5"), np.arange(20000) * 7 % 251)
        full_disk_part(d)
    finish()
with tempfile.TemporaryDirectory() as d:
    write_tokens(os.path.join(d, "train.h5"), np.arange(20000) * 7 % 251)
    damaged_part(d)
    failed_write_part(d)
ns = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
p = subprocess.run(ns + ["--propagation", "private", sys.executable, os.path.abspath(__file__), "--full-disk"],
                   capture_output=True, text=True)
print(p.stdout + p.stderr, end="")
if "full-disk part running" not in p.stdout:
    print(f"SKIPPED: no mount namespace here ({' '.join(ns)}); the full-disk cases did not run")
else:
    check(p.returncode == 0, f"the full-disk cases pass (rc={p.returncode})")
finish()
