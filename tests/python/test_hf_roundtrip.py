"""Weights between our checkpoints, model files and Hugging Face directories (gpt2-ckpt export-hf /
import-hf, train.init_from, gpt2-generate's loaders), checked with transformers and h5py.

2 CPU ranks (mpiexec, ZeRO-1: the fp32 masters are sharded) train a model with GPT-2's real vocab
(50257, padded to 50304 inside) for 3 steps and save. Then:
- export-hf: transformers' GPT2LMHeadModel.from_pretrained loads the directory, its logits equal
  the checkpoint's logits through our model (fp32, max|diff|/max|ref| <= 1e-4; GPT2_TEST_DEVICE=cuda
  runs both on the GPU), and its parameters equal the consolidated masters bit for bit;
- import-hf of that export equals `consolidate` of the checkpoint bit for bit (every dataset), and
  an HF model imported then exported equals the original HF state dict bit for bit;
- train.init_from (a model file, an HF directory) with lr 1e-30 (below every weight's ulp) for one step saves exactly the weights
  it started from; a model of another shape is refused naming the key;
- gpt2-generate gives the same greedy ids from the checkpoint, the model file and the export;
- damaged inputs (truncated safetensors, a header length past the end) exit 2 naming the file.
Run by CTest (env GPT2_BIN_DIR, GPT2_TEST_BIN_DIR, GPT2_SOURCE_DIR)."""
import json, os, struct, subprocess, tempfile
import h5py, numpy as np, torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel
from checks import check, finish, write_tokens

SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
PROBE = os.path.join(os.environ.get("GPT2_TEST_BIN_DIR", "build/tests"), "hf_logits_probe")
DEVICE = os.environ.get("GPT2_TEST_DEVICE", "cpu")
MPI = ["mpiexec", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def run(args, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=SRC)
    return p.returncode, p.stdout + p.stderr


def tool(name, *args):
    return run([os.path.join(BIN_DIR, name), *args])


def h5_tensors(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f.keys()}, dict(f.attrs)


def same_datasets(a, b):
    (da, _), (db, _) = h5_tensors(a), h5_tensors(b)
    return da.keys() == db.keys() and all(np.array_equal(da[k].view(np.uint32), db[k].view(np.uint32)) for k in da)


def train(tmp, name, extra, steps, nprocs=MPI):
    train_file = os.path.join(tmp, "train.h5")
    if not os.path.exists(train_file):
        write_tokens(train_file, np.random.default_rng(0).integers(0, 50257, 30000), vocab=50257, eot=50256)
    root = os.path.join(tmp, name)
    args = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=50257",
            "--model.block_size=32", f"--data.train={train_file}", "--data.val=none", "--train.micro_batch=2",
            "--train.seq_len=16", "--train.batch_tokens=64", f"--train.max_steps={steps}", "--train.sample_tokens=0",
            "--train.device=cpu", "--precision.dtype=fp32", "--log.metrics=none", "--log.tensorboard=none",
            "--parallel.zero_stage=1", f"--checkpoint.dir={root}", f"--checkpoint.every={steps}"]
    keys = {e.split("=")[0] for e in extra}  # extra overrides (an option may be given once)
    args = [a for a in args if a.split("=")[0] not in keys] + list(extra)
    rc, log = run(nprocs + [os.path.join(BIN_DIR, "gpt2-train")] + args)
    return rc, log, root


def probe_logits(model_path, idx):
    inp, out = os.path.join(TMP, "in.safetensors"), os.path.join(TMP, "out.safetensors")
    save_file({"idx": idx.clone(), "targets": idx.clone()}, inp)
    rc, log = run([PROBE, "logits", model_path, inp, out], timeout=120)
    check(rc == 0, f"hf_logits_probe logits {os.path.basename(model_path)} (rc={rc})")
    if rc != 0:
        print(log[-2000:])
        finish()
    return load_file(out)["logits"]


with tempfile.TemporaryDirectory() as TMP:
    rc, log, root = train(TMP, "ckpt", [], 3)
    ckpt = os.path.join(root, "step_0000003")
    check(rc == 0 and os.path.isdir(ckpt), f"2 ranks (ZeRO-1) train 3 steps with vocab 50257 and save (rc={rc})")
    if rc != 0:
        print(log[-3000:])
        finish()

    # ---- export-hf: loads in transformers, same logits, same weights as the consolidated masters
    hf = os.path.join(TMP, "hf")
    rc, log = tool("gpt2-ckpt", "export-hf", root, "--out", hf)
    check(rc == 0 and "wrote" in log, f"gpt2-ckpt export-hf ROOT --out hf (rc={rc}): {log.strip()[-200:]}")
    cfg = json.load(open(os.path.join(hf, "config.json")))
    check(cfg["vocab_size"] == 50257 and cfg["n_positions"] == 32 and cfg["n_layer"] == 2,
          f"config.json: vocab_size {cfg['vocab_size']}, n_positions {cfg['n_positions']}, n_layer {cfg['n_layer']}")
    model = GPT2LMHeadModel.from_pretrained(hf).eval().to(DEVICE)
    check(model.transformer.wte.weight.shape == (50257, 32), "HF wte has the real vocab's 50257 rows")
    idx = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(3))
    ours = probe_logits(root, idx)
    with torch.no_grad():
        ref = model(idx.to(DEVICE)).logits.cpu()
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    check(rel <= 1e-4, f"[{DEVICE}] our logits from the checkpoint vs HF's from the export: max|diff|/max|ref| = {rel:.2e}")

    consolidated = os.path.join(TMP, "consolidated.h5")
    rc, log = tool("gpt2-ckpt", "consolidate", root, "--out", consolidated)
    check(rc == 0, f"gpt2-ckpt consolidate (rc={rc})")
    masters, attrs = h5_tensors(consolidated)
    sd = {k: v.cpu() for k, v in model.state_dict().items()}
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    exact = True
    for name, values in masters.items():
        hf_value = sd[name].numpy()
        if name.endswith(conv1d):
            hf_value = hf_value.T  # Conv1D (in, out) vs our Linear (out, in)
        if name == "transformer.wte.weight":
            exact &= not values[50257:].any()  # our padding rows are zero and not exported
            values = values[:50257]
        exact &= np.array_equal(values, hf_value)
    check(exact, f"the export's {len(masters)} tensors equal the consolidated fp32 masters bit for bit (Conv1D transposed)")

    # ---- import-hf: round trips
    imported = os.path.join(TMP, "imported.h5")
    rc, log = tool("gpt2-ckpt", "import-hf", hf, "--out", imported)
    check(rc == 0, f"gpt2-ckpt import-hf hf --out imported.h5 (rc={rc}): {log.strip()[-200:]}")
    check(same_datasets(imported, consolidated), "export-hf then import-hf equals consolidate, bit for bit")
    _, iattrs = h5_tensors(imported)
    check(iattrs["vocab_size"] == 50257 and iattrs["n_embd"] == 32, "the model file records the config")

    torch.manual_seed(5)
    orig = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, n_positions=32)).eval()
    with torch.no_grad():
        for p in orig.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf0 = os.path.join(TMP, "hf0")
    orig.save_pretrained(hf0)
    m0, hf2 = os.path.join(TMP, "m0.h5"), os.path.join(TMP, "hf2")
    rc1, _ = tool("gpt2-ckpt", "import-hf", hf0, "--out", m0)
    rc2, _ = tool("gpt2-ckpt", "export-hf", m0, "--out", hf2)
    back = GPT2LMHeadModel.from_pretrained(hf2).state_dict()
    check(rc1 == 0 and rc2 == 0 and all(torch.equal(back[k], v) for k, v in orig.state_dict().items()),
          "HF save_pretrained -> import-hf -> export-hf -> from_pretrained: every tensor bit for bit")

    # ---- train.init_from: lr 1e-30 (far below the ulp of every weight) for one step keeps exactly the starting weights
    for source, what in ((m0, "a model file"), (hf0, "an HF directory")):
        rc, log, r = train(TMP, "ft_" + os.path.basename(source), [f"--train.init_from={source}", "--train.lr=1e-30",
                                                                   "--train.min_lr=0"], 1)
        out = os.path.join(TMP, "ft.h5")
        rc2, _ = tool("gpt2-ckpt", "consolidate", r, "--out", out)
        check(rc == 0 and rc2 == 0 and "initial weights from" in log and same_datasets(out, m0),
              f"train.init_from = {what}, lr 1e-30, 1 step: the saved weights are the imported ones bit for bit (rc={rc})")
    rc, log, _ = train(TMP, "bad_init", [f"--train.init_from={m0}", "--model.n_layer=3"], 1)
    check(rc == 2 and "train.init_from" in log and "n_layer is 2" in log and "model has 3" in log,
          f"train.init_from with model.n_layer=3 against a 2-layer file: exit 2 naming the key (rc={rc})")

    # ---- gpt2-generate reads all three kinds alike
    outs = []
    for src in (root, consolidated, hf):
        rc, log = tool("gpt2-generate", src, "--ids", "--prompt", "464 2068 7586", "--temperature", "0",
                       "--max_new_tokens", "12", "--ignore_eot", "--device", "cpu")
        outs.append(log.splitlines()[0] if rc == 0 else f"rc={rc}: {log[-300:]}")
    check(outs[0] == outs[1] == outs[2] and len(outs[0].split()) == 15,
          f"gpt2-generate greedy from the checkpoint, the model file and the export agree: {outs[0]}")

    # ---- damaged Hugging Face files are named
    bad = os.path.join(TMP, "bad")
    os.makedirs(bad)
    with open(os.path.join(hf, "config.json")) as f, open(os.path.join(bad, "config.json"), "w") as g:
        g.write(f.read())
    st = os.path.join(bad, "model.safetensors")
    data = open(os.path.join(hf, "model.safetensors"), "rb").read()
    open(st, "wb").write(data[: len(data) - 100])
    rc, log = tool("gpt2-ckpt", "import-hf", bad, "--out", os.path.join(TMP, "x.h5"))
    check(rc == 2 and "model.safetensors" in log and not os.path.exists(os.path.join(TMP, "x.h5")),
          f"import-hf of a truncated model.safetensors: exit 2 naming it, nothing written (rc={rc}): {log.strip()[-160:]}")
    open(st, "wb").write(struct.pack("<Q", 10**12) + data[8:])
    rc, log = tool("gpt2-generate", bad, "--ids", "--prompt", "1")
    check(rc == 2 and "model.safetensors" in log and "header" in log,
          f"gpt2-generate with a header length past the end: exit 2 naming the file (rc={rc}): {log.strip()[-160:]}")
    rc, log = tool("gpt2-ckpt", "import-hf", root, "--out", os.path.join(TMP, "y.h5"))
    check(rc == 2 and "not a Hugging Face directory" in log, f"import-hf of a checkpoint is refused (rc={rc})")

finish()
