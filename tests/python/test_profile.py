"""--profile.steps=2 on a CPU run writes a Chrome trace that Python's json reads, with the step
phases as user annotations around real ops, and logs the top ops by time. Run by CTest."""
import json, os, re, subprocess, tempfile
import numpy as np
from checks import check, failures, finish, write_tokens

BIN = os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-train")
with tempfile.TemporaryDirectory() as d:
    train = os.path.join(d, "train.h5")
    write_tokens(train, np.arange(20000) * 7 % 251)
    prof = os.path.join(d, "prof")
    p = subprocess.run([BIN, "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=256",
                        "--model.block_size=32", f"--data.train={train}", "--data.val=none", "--train.micro_batch=2",
                        "--train.seq_len=16", "--train.batch_tokens=64", "--train.max_steps=6", "--train.device=cpu",
                        "--precision.dtype=fp32", "--train.sample_tokens=0", "--log.metrics=none",
                        "--checkpoint.resume=none", "--profile.steps=2", f"--profile.dir={prof}"],
                       capture_output=True, text=True, errors="replace", timeout=300)
    out = p.stdout + p.stderr
    check(p.returncode == 0, f"gpt2-train --profile.steps=2 runs (rc={p.returncode})")
    check("profiling steps 2-3" in out, "it profiles steps 2-3 (after two warm-up steps)")
    path = os.path.join(prof, "trace_rank0.json")
    check(os.path.isfile(path), f"{path} exists")
    if os.path.isfile(path):
        events = json.load(open(path))["traceEvents"]
        phases = {e["name"] for e in events if e.get("cat") == "user_annotation"}
        check({"forward", "backward", "optimizer", "data"} <= phases, f"phases in the trace: {sorted(phases)}")
        ops = [e for e in events if e.get("name") == "aten::mm" and e.get("dur", 0) > 0]
        check(len(ops) > 0, f"matrix multiplies are in the trace ({len(ops)})")
        fwd = [e for e in events if e.get("name") == "forward" and e.get("cat") == "user_annotation"]
        check(len(fwd) == 4, f"one forward range per micro-step: 2 steps x 2 micro-steps ({len(fwd)})")
    # The top-ops table must agree with the trace it was computed from: same ms and calls per step
    # per name, sorted, and its first line the largest name in the trace. (Which ops lead depends
    # on timing on a loaded machine, so no op is required by name.)
    top = out.split("top CPU ops by time")[-1] if "top CPU ops by time" in out else ""
    rows = [(float(m[1]), float(m[2]), m[3].strip()) for m in
            re.finditer(r"\]\s+([\d.]+) ms\s+([\d.]+)\s+[\d.]+%\s+(.+)", top)]
    check(len(rows) == 15, f"the log lists the top 15 ops ({len(rows)})")
    check(all(a[0] >= b[0] for a, b in zip(rows, rows[1:])), "sorted by time")
    if os.path.isfile(path):
        per_name = {}
        for e in events:
            # Ops and phase ranges; not the profiler's own span over the window (cat "Trace").
            if e.get("ph") == "X" and e.get("cat") != "Trace" and not e["name"].startswith("ProfilerStep"):
                t = per_name.setdefault(e["name"][:110], [0.0, 0])
                t[0] += e.get("dur", 0) / 1e3 / 2
                t[1] += 1 / 2
        for ms, calls, name in rows:
            ref = per_name.get(name, [float("nan"), 0])
            check(abs(ms - ref[0]) <= 0.02 * ref[0] + 0.01 and calls == ref[1],
                  f"{name}: {ms} ms, {calls} calls per step in the log; the trace says {ref[0]:.3f} ms, {ref[1]}")
        if rows and per_name:
            check(rows[0][2] == max(per_name, key=lambda n: per_name[n][0]), f"{rows[0][2]} leads in the trace too")
    if failures: print(out[-3000:])
finish()
