"""gpt2-eval against two independent references. A small model is trained on CPU (gpt2-train) and
its checkpoint taken after the last step, where the trainer logs its last val loss; then:
- gpt2-eval on the same windows gives the trainer's val loss (1e-5 relative: the same model, the
  windows grouped differently into float32 batch means), on 1 rank, on 2 ranks (mpiexec), and
  with another --batch;
- transformers' GPT2LMHeadModel on `gpt2-ckpt export-hf` of the checkpoint gives the same loss
  over those windows (1e-4 relative, float32);
- with its defaults it measures a bf16 checkpoint in bf16, as the trainer did;
- bad input exits 2 naming the option or file. Run by CTest."""
import os, re, subprocess, tempfile
import numpy as np, torch
from transformers import GPT2LMHeadModel
from checks import check, finish, write_tokens

BIN = os.environ.get("GPT2_BIN_DIR", "build/bin")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
MPI = ["mpiexec", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=SRC)
    return p.returncode, p.stdout + p.stderr


def eval_loss(out):
    m = re.search(r"^loss ([\d.]+) \| perplexity ([\d.]+) \| (\d+) windows x (\d+) tokens", out, re.M)
    return (float(m[1]), float(m[2]), int(m[3]), int(m[4])) if m else (float("nan"), float("nan"), 0, 0)


with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 250, size=rng.integers(4, 10)) for _ in range(30)]
    def stream(n):
        out = []
        while len(out) < n:
            out.extend(sentences[rng.integers(0, len(sentences))]); out.append(255)
        return np.asarray(out[:n])
    train_h5, val_h5 = os.path.join(d, "train.h5"), os.path.join(d, "val.h5")
    val_tokens = stream(3000)
    write_tokens(train_h5, stream(40000)); write_tokens(val_h5, val_tokens)
    T, mb, eval_steps, steps = 32, 4, 4, 12
    import json

    def train(dtype):
        """The trainer's last val loss and the checkpoint it was measured on."""
        metrics, ckpt = os.path.join(d, f"m_{dtype}.jsonl"), os.path.join(d, f"ckpt_{dtype}")
        rc, out = run([os.path.join(BIN, "gpt2-train"), "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32",
                       "--model.vocab_size=256", "--model.block_size=64", f"--data.train={train_h5}",
                       f"--data.val={val_h5}", f"--train.micro_batch={mb}", f"--train.seq_len={T}",
                       f"--train.batch_tokens={mb * T}", f"--train.max_steps={steps}", "--train.lr=3e-3",
                       "--train.warmup_steps=2", "--train.eval_every=0", f"--train.eval_steps={eval_steps}",
                       "--train.sample_tokens=0", "--train.device=cpu", f"--precision.dtype={dtype}",
                       f"--log.metrics={metrics}", f"--checkpoint.dir={ckpt}", f"--checkpoint.every={steps}",
                       "--checkpoint.resume=none"])
        check(rc == 0, f"gpt2-train {dtype} runs (rc={rc})")
        if rc != 0: print(out[-2000:])
        vals = [json.loads(l) for l in open(metrics) if "val_loss" in l] if os.path.exists(metrics) else []
        # The last eval is of the weights after the last update: what the last checkpoint holds.
        check(len(vals) == 1 and vals[-1]["step"] == steps, f"{dtype}: one eval, at step {steps}: {vals}")
        return (vals[-1]["val_loss"] if vals else float("nan")), os.path.join(ckpt, f"step_{steps:07d}")

    trainer_val, step_dir = train("fp32")
    windows = eval_steps * mb

    EVAL = os.path.join(BIN, "gpt2-eval")
    base = [step_dir, "--data", val_h5, "--seq_len", str(T), "--windows", str(windows)]
    rc, out = run([EVAL, *base, "--batch", str(mb)])
    loss, ppl, w, t = eval_loss(out)
    check(rc == 0 and (w, t) == (windows, T), f"gpt2-eval runs on {windows} windows of {T} (rc={rc}): {out.strip()[-300:]}")
    check(abs(loss - trainer_val) <= 1e-5 * trainer_val,
          f"gpt2-eval {loss:.6f} equals the trainer's val loss {trainer_val:.6f} on the same windows")
    check(abs(ppl - np.exp(loss)) <= 1e-3 * ppl, f"perplexity {ppl} = exp(loss)")
    rc, out = run([EVAL, *base, "--batch", "3"])
    check(rc == 0 and abs(eval_loss(out)[0] - loss) <= 1e-5 * loss, f"--batch 3 gives the same loss ({eval_loss(out)[0]:.6f})")
    rc, out = run(MPI + [EVAL, *base, "--batch", "3"])
    loss2 = eval_loss(out)[0]
    check(rc == 0 and abs(loss2 - loss) <= 1e-5 * loss, f"2 ranks give the same loss ({loss2:.6f}, rc={rc})")
    if rc != 0: print(out[-1500:])

    # With its defaults gpt2-eval runs a checkpoint in the dtype it was trained in: a bf16 run's val
    # loss is measured again exactly (the same bf16 weights, batches of the same rows in the same
    # kernels; only the float64 mean of the batch losses is taken in another order, ~1e-16).
    bf16_val, bf16_dir = train("bf16")
    rc, out = run([EVAL, bf16_dir, "--data", val_h5, "--seq_len", str(T), "--windows", str(windows), "--batch", str(mb)])
    # (gpt2-eval prints 6 decimals: half a unit of the last one. In fp32 the same checkpoint gives
    # a loss 3.4e-4 away, so the check tells the dtypes apart.)
    check(rc == 0 and abs(eval_loss(out)[0] - bf16_val) <= 5e-7,
          f"gpt2-eval's defaults on a bf16 checkpoint: {eval_loss(out)[0]!r} equals the trainer's {bf16_val!r} (rc={rc})")

    # transformers on the exported model, the same windows: window w is tokens [w*T, w*T + T + 1).
    hf = os.path.join(d, "hf")
    rc, out = run([os.path.join(BIN, "gpt2-ckpt"), "export-hf", step_dir, "--out", hf])
    check(rc == 0, f"export-hf (rc={rc})")
    model = GPT2LMHeadModel.from_pretrained(hf).eval()
    idx = torch.tensor(np.stack([val_tokens[w * T: w * T + T + 1] for w in range(windows)]), dtype=torch.long)
    with torch.no_grad():
        logits = model(idx[:, :-1]).logits.double()
    hf_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1)).item()
    check(abs(loss - hf_loss) <= 1e-4 * hf_loss, f"gpt2-eval {loss:.6f} equals transformers' loss {hf_loss:.6f}")
    rc, out = run([EVAL, hf, "--data", val_h5, "--seq_len", str(T), "--windows", str(windows)])
    check(rc == 0 and abs(eval_loss(out)[0] - hf_loss) <= 1e-4 * hf_loss,
          f"gpt2-eval on the HF directory: {eval_loss(out)[0]:.6f}")

    # Bad input: exit 2, naming what is wrong.
    missing = os.path.join(d, "nope")
    bad_ids = os.path.join(d, "bad_ids.h5")
    write_tokens(bad_ids, np.asarray([1] * 100 + [300] + [2] * 200))  # the header says 256; one id is not
    for args, needle in [([missing, "--data", val_h5], missing),
                         ([step_dir], "no --data"),
                         ([step_dir, "--data", missing], missing),
                         ([step_dir, "--data", val_h5, "--seq_len", "65"], "--seq_len = 65"),
                         ([step_dir, "--data", val_h5, "--windows", "100000"], "--windows = 100000"),
                         ([step_dir, "--data", val_h5, "--batch", "0"], "--batch = 0"),
                         ([step_dir, "--data", val_h5, "--device", "tpu"], "--device = tpu"),
                         ([step_dir, "--data", val_h5, "--bogus"], "bogus"),
                         # an id the model has no row for: named with its file and position, no stack trace
                         ([step_dir, "--data", bad_ids, "--seq_len", str(T)],
                          f"{bad_ids}: token id 300 at position 100 is outside the model's vocab_size = 256")]:
        rc, out = run([EVAL, *args])
        check("frame #" not in out and "Exception raised from" not in out, f"{args[1:]}: no C++ stack trace")
        check(rc == 2 and needle in out, f"{args[1:]} exits 2 naming {needle!r} (rc={rc}): {out.strip()[-200:]}")
finish()
