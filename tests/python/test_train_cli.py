"""gpt2-train end to end on CPU: a learnable token stream written independently with h5py, the
loss must fall, metrics.jsonl must carry DESIGN.md's fields, and bad input must exit 2 naming the
key or file. Run by CTest (env GPT2_BIN_DIR, GPT2_SOURCE_DIR)."""
import json, os, re, subprocess, tempfile
import h5py, numpy as np
from checks import check, finish

BIN = os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-train")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")

def token_file(path, tokens, vocab=50257, fmt="gpt2-tokens"):
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.uint16))  # contiguous, no filters
        f.attrs["format"] = fmt; f.attrs["format_version"] = 1
        f.attrs["vocab_size"] = vocab; f.attrs["eot_token"] = 50256; f.attrs["tokenizer"] = "gpt2"

def override(args, extra):
    """args with each --key=value of extra replacing the same key (options may appear only once)."""
    keys = {e.split("=")[0] for e in extra}
    return [a for a in args if a.split("=")[0] not in keys] + extra

def run(args, timeout=600, cwd=SRC):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=cwd)
    return p.returncode, p.stdout + p.stderr

with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(0)
    # A stream with structure: repeated random "sentences" over 200 ids; easily learnable.
    sentences = [rng.integers(0, 200, size=rng.integers(5, 12)) for _ in range(40)]
    def stream(n):
        out = []
        while len(out) < n:
            out.extend(sentences[rng.integers(0, len(sentences))]); out.append(50256)
        return out[:n]
    train, val = os.path.join(d, "train.h5"), os.path.join(d, "val.h5")
    token_file(train, stream(60000)); token_file(val, stream(8000))
    metrics = os.path.join(d, "m.jsonl")
    base = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=64", "--model.block_size=64",
            f"--data.train={train}", f"--data.val={val}", "--train.micro_batch=8", "--train.seq_len=32",
            "--train.batch_tokens=512", "--train.lr=3e-3", "--train.min_lr=3e-4", "--train.warmup_steps=5",
            "--train.eval_every=40", "--train.eval_steps=4", "--train.sample_tokens=8", "--train.device=cpu",
            "--precision.dtype=fp32", "--log.every=10", f"--log.metrics={metrics}"]

    rc, out = run(base + ["--train.max_steps=120"])
    check(rc == 0, f"tiny training exits 0 (rc={rc})")
    if rc != 0: print(out[-3000:])
    lines = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    steps = [l for l in lines if "loss" in l]
    evals = [l for l in lines if "val_loss" in l]
    need = {"step", "loss", "lr", "grad_norm", "tokens_per_sec", "ms_per_step", "mfu", "peak_mem_gib"}
    check(len(steps) >= 12 and all(need <= set(l) for l in steps), f"metrics lines carry {sorted(need)}")
    # No peak FLOP rate to divide by on a CPU: "n/a" and null, not 0%.
    check(all(l["mfu"] is None for l in steps) and "mfu n/a" in out and "mfu 0.0%" not in out, "mfu n/a on CPU")
    # The last eval is of the model after the last update (the one saved), logged at step 120.
    check([e["step"] for e in evals] == [0, 40, 80, 120], f"val_loss at steps 0,40,80,120: {[e['step'] for e in evals]}")
    if steps and evals:
        check(abs(steps[0]["loss"] - np.log(50257)) < 0.3, f"initial loss {steps[0]['loss']:.3f} ~ ln(50257)")
        check(evals[-1]["val_loss"] < evals[0]["val_loss"] - 5.0,
              f"val loss falls by > 5 nats: {evals[0]['val_loss']:.3f} -> {evals[-1]['val_loss']:.3f}")
        check(steps[-1]["tokens_per_sec"] > 0 and steps[-1]["peak_mem_gib"] > 0, "speed and memory reported")
    check("sample at step 120" in out, "a sample is printed at the end")
    check("train.batch_tokens" in out and "[rank 0/1]" in out, "settings table and rank prefix in the log")
    # The ETA comes from the steps after the first (which carries warm-up): unknown on step 0.
    etas = re.findall(r"step (\d+)/120 \| loss .*\| eta (\S+)", out)
    check(len(etas) >= 12 and etas[0] == ("0", "--") and all(re.fullmatch(r"\d+[hms].*", e) for _, e in etas[1:]),
          f"eta -- on step 0, then a duration: {etas[:3]}")

    # train.lr_schedule = wsd: the logged lr is the schedule computed here by hand: warmup 5 steps,
    # 3e-3 until the last 25% of 40 steps (from step 30), then a line to 3e-4 at step 40.
    mw = os.path.join(d, "mw.jsonl")
    rcw, _ = run(override(base, [f"--log.metrics={mw}", "--train.max_steps=40", "--train.lr_schedule=wsd",
                                 "--train.decay_frac=0.25", "--log.every=1", "--train.eval_every=0"]))
    def wsd(s):
        if s < 5: return 3e-3 * (s + 1) / 5
        return 3e-3 if s < 30 else 3e-4 + (1 - (s - 30) / 10) * (3e-3 - 3e-4)
    got = {l["step"]: l["lr"] for l in map(json.loads, open(mw)) if "lr" in l} if rcw == 0 else {}
    check(len(got) == 40 and all(abs(got[s] - wsd(s)) <= 1e-9 * 3e-3 for s in got),
          f"wsd: the logged lr follows warmup, stable, linear decay (rc={rcw}; steps 29-31: "
          f"{[got.get(s) for s in (29, 30, 31)]})")

    # Same run twice gives the same losses (seeded init and data order).
    m2 = os.path.join(d, "m2.jsonl")
    rc2, _ = run(override(base, [f"--log.metrics={m2}", "--train.max_steps=20"]))
    m3 = os.path.join(d, "m3.jsonl")
    rc3, _ = run(override(base, [f"--log.metrics={m3}", "--train.max_steps=20"]))
    l2 = [l.get("loss") for l in map(json.loads, open(m2))] if rc2 == 0 else [1]
    l3 = [l.get("loss") for l in map(json.loads, open(m3))] if rc3 == 0 else [2]
    check(l2 == l3, "two runs with one seed log identical losses")
    # precision.fp8 = auto on a CPU is off, said in the log: the same losses as m2 (fp8 = false).
    m4 = os.path.join(d, "m4.jsonl")
    rc4, out4 = run(override(base, [f"--log.metrics={m4}", "--train.max_steps=20", "--precision.fp8=auto"]))
    l4 = [l.get("loss") for l in map(json.loads, open(m4))] if rc4 == 0 else [3]
    off = ("precision.fp8 = auto: off (it needs a CUDA GPU with FP8 tensor cores (compute capability 8.9 or newer); "
           "this run trains on cpu)")
    check(rc4 == 0 and l4 == l2 and off in out4
          and re.search(r"precision\.fp8 +false", out4),
          f"precision.fp8 = auto on a CPU: off, logged, the fp8 = false run's losses (rc={rc4})")

    # Bad input: exit code 2 and a message naming the key or file.
    cases = [
        (base + ["--train.nope=1"], "train.nope"),
        (base + ["--train.lr=abc"], "train.lr"),
        (base + ["--model.n_embd=65"], "model.n_embd"),
        (base + ["--train.batch_tokens=500"], "train.batch_tokens"),
        (override(base, ["--data.train=/nonexistent/train.h5"]), "/nonexistent/train.h5"),
        (base + ["--config", "/nonexistent/cfg.ini"], "/nonexistent/cfg.ini"),
        (base + ["--config", d], f"config file {d}: is a directory"),
        (base + ["--precision.fp8=true"], "precision.fp8 = true: needs a CUDA GPU with FP8 tensor cores"),
        (base + ["--precision.fp8=yes"], "precision.fp8 = yes: must be one of false | true | auto"),
        (base + ["--precision.fp8=true", "--precision.fp8_amax_history=1"], "precision.fp8_amax_history = 1"),
        (base + ["--precision.fp8=true", "--precision.fp8_amax_history=1025"], "precision.fp8_amax_history = 1025"),
    ]
    bad_ids = os.path.join(d, "bad_ids.h5")
    token_file(bad_ids, [1, 2, 3] * 100 + [600] + [4] * 100)
    cases.append((override(base, [f"--data.train={bad_ids}", "--model.vocab_size=512"]), "bad_ids.h5"))
    wrong_fmt = os.path.join(d, "wrong_fmt.h5")
    token_file(wrong_fmt, [1] * 1000, fmt="something-else")
    cases.append((override(base, [f"--data.train={wrong_fmt}"]), "wrong_fmt.h5"))
    not_h5 = os.path.join(d, "not_h5.h5")
    open(not_h5, "w").write("hello")
    cases.append((override(base, [f"--data.train={not_h5}"]), "not_h5.h5"))
    short = os.path.join(d, "short.h5")  # 10 tokens, one window needs seq_len + 1 = 33
    token_file(short, list(range(10)))
    cases.append((override(base, [f"--data.train={short}"]), f"data.train = {short}: token stream of 10 tokens"))
    cases.append((override(base, [f"--data.val={short}"]), f"data.val = {short}: token stream of 10 tokens"))
    for args, needle in cases:
        rc, out = run(override(args, ["--train.max_steps=50"]), timeout=300)
        check(rc == 2 and needle in out, f"exit 2 naming {needle!r} (rc={rc})")
        if not (rc == 2 and needle in out): print(out[-1500:])

    # Absurd sizes are refused from the estimate, before anything is allocated (they used to grow
    # until the OOM killer came, or end in a LibTorch allocation error with a stack trace): exit 2,
    # the settings table first, the keys named, no trace, and in seconds.
    for extra, needles in [(["--model.n_layer=99999999999"], ["model.n_layer", "needs at least", "GiB"]),
                           (["--model.n_embd=4294967424", "--model.n_head=1"], ["model.n_embd = 4294967424", "overflow"]),
                           (["--train.micro_batch=10000000", "--train.batch_tokens=320000000"], ["train.micro_batch", "activations"])]:
        rc, out = run(override(base, extra + ["--train.max_steps=5"]), timeout=60)
        ok = rc == 2 and all(n in out for n in needles) and "model.n_layer" in out.split("needs")[0] \
            and "frame #" not in out and "Exception raised from" not in out
        check(ok, f"{extra}: exit 2 naming {needles} after the settings table, no stack trace (rc={rc})")
        if not ok: print(out[-2000:])
    # Outside the repository: the tokenizer is found as every tool finds it (it was looked up in
    # the working directory), and a relative path that names nothing says against what it was read.
    rc, out = run(override(base, ["--train.max_steps=2"]), cwd=d)
    check(rc == 0 and "sample at step 2" in out, f"gpt2-train from another directory samples (rc={rc})")
    if rc != 0: print(out[-1500:])
    rc, out = run(override(base, ["--data.train=nope/train.h5", "--train.max_steps=2"]), cwd=d)
    check(rc == 2 and f"nope/train.h5: cannot open token file: No such file or directory (relative to the working "
          f"directory {os.path.realpath(d)})" in out, f"a relative path names the directory it was read against (rc={rc})")
    # A run that fits logs its estimate with the settings.
    rc, out = run(override(base, ["--train.max_steps=1"]))
    check(rc == 0 and "memory (estimate, per rank):" in out, f"the estimate is logged (rc={rc})")

finish()
