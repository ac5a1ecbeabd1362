"""Shared by the Python reference tests: a soft `check` that records failures (so one run
reports every broken expectation), the exit that turns them into the test's status, and a runner
for the gpt2-data executable (env GPT2_BIN_DIR / GPT2_SOURCE_DIR, set by CTest)."""
import os
import subprocess
import sys

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def finish():
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


def gpt2_data(args, timeout=600):
    exe = os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-data")
    p = subprocess.run([exe] + args, capture_output=True, text=True, errors="replace",
                       cwd=os.environ.get("GPT2_SOURCE_DIR", "."), timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def write_tokens(path, tokens, vocab=256, eot=255):
    """A token file in our format written with h5py (an independent writer): uint16, contiguous."""
    import h5py, numpy as np
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.uint16))
        f.attrs.update(format="gpt2-tokens", format_version=1, vocab_size=vocab, eot_token=eot, tokenizer="gpt2")


def tiny_train_args(train, **over):
    """gpt2-train options for a 2-layer fp32 CPU model on the token file `train` (vocabulary 256,
    batches of 128 tokens, no eval, no samples, a log line every step); `over` replaces or adds
    keys ("model.n_embd": 64, ...)."""
    a = {"model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.vocab_size": 256, "model.block_size": 32,
         "data.train": train, "data.val": "none", "train.micro_batch": 2, "train.seq_len": 16,
         "train.batch_tokens": 128, "train.sample_tokens": 0, "train.device": "cpu", "precision.dtype": "fp32",
         "log.every": 1}
    a.update(over)
    return [f"--{k}={v}" for k, v in a.items()]
