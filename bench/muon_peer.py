"""The reference our Muon is held to (issue 42): GPT-2 trained in PyTorch with torch.optim.Muon on the
blocks' weight matrices (qkv, proj, fc, fc2, stored as nn.Linear (out, in), as ours are) and
torch.optim.AdamW on the rest, with gpt2-train's hyperparameters, LR schedule (optim/lr_schedule.cpp),
gradient clipping and evaluation, on our token files (read with h5py).

It first writes its initial weights as a Hugging Face directory (--init_out), which gpt2-train starts
from (train.init_from), so both runs begin from the same weights. Training windows are gpt2-train's,
in its order (WindowOrder re-derives data/batch_sampler's seeded per-epoch permutation): several
passes over a small text make the order matter, since drawing windows with replacement leaves about a
third of them unseen each pass. The val windows are gpt2-train's too: the first eval_steps x micro_batch windows of the val file, wrapping around it as
gpt2-train does when it holds fewer.
Writes JSON lines {"step", "loss", "ms_per_step"} and {"step", "val_loss"} to --metrics.
"""
import argparse, json, math, os, struct, time
import h5py, numpy as np, torch, torch.nn as nn, torch.nn.functional as F


def save_safetensors(tensors, path):
    """fp32 tensors as a .safetensors file (8-byte header length, JSON header, data), written here so
    that the GPU machine needs no safetensors package."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b); at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for b in blobs: f.write(b)


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__(); s.H = H
        s.ln_1 = nn.LayerNorm(C); s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C); s.fc = nn.Linear(C, 4 * C); s.fc2 = nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in s.qkv(s.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, L, C, H, V, T):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.h = nn.ModuleList(Block(C, H) for _ in range(L)); s.ln_f = nn.LayerNorm(C)
        for name, p in s.named_parameters():  # GPT-2's init: N(0, 0.02), residual projections / sqrt(2L)
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.reshape(-1))

    def hf_state_dict(s):
        """Hugging Face GPT-2 names; Conv1D weights are (in, out)."""
        out = {"transformer.wte.weight": s.wte.weight, "transformer.wpe.weight": s.wpe.weight,
               "transformer.ln_f.weight": s.ln_f.weight, "transformer.ln_f.bias": s.ln_f.bias}
        for i, b in enumerate(s.h):
            p = f"transformer.h.{i}."
            for ours, hf in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
                out[p + hf + ".weight"] = getattr(b, ours).weight; out[p + hf + ".bias"] = getattr(b, ours).bias
            for ours, hf in (("qkv", "attn.c_attn"), ("proj", "attn.c_proj"), ("fc", "mlp.c_fc"), ("fc2", "mlp.c_proj")):
                out[p + hf + ".weight"] = getattr(b, ours).weight.t(); out[p + hf + ".bias"] = getattr(b, ours).bias
        return {k: v.detach().float().contiguous().cpu() for k, v in out.items()}


M64 = (1 << 64) - 1


def mix64(x):  # splitmix64's finalizer, as data/batch_sampler.cpp
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class WindowOrder:
    """gpt2-train's window order (data/batch_sampler.h): global sample g reads window
    permute(g % W) of epoch g / W, a 4-round Feistel network over 2h bits keyed by (seed, epoch),
    cycle-walked into [0, W)."""

    def __init__(s, windows, seed):
        s.windows, s.seed = windows, seed
        bits = 2
        while (1 << bits) < windows: bits += 1
        s.half = (bits + 1) // 2

    def window(s, g):
        key = mix64(s.seed ^ mix64(g // s.windows + 1))
        mask, x = (1 << s.half) - 1, g % s.windows
        while True:
            left, right = x >> s.half, x & mask
            for r in range(4):
                left, right = right, left ^ (mix64(key ^ ((r * 0x632BE59BD9B4E019) & M64) ^ right) & mask)
            x = (left << s.half) | right
            if x < s.windows: return x


def lr_at(step, a):  # optim/lr_schedule.cpp
    if step < a.warmup: return a.lr * (step + 1) / a.warmup
    if step >= a.steps: return a.min_lr
    decay_start = max(a.warmup, a.steps - round(a.decay_frac * a.steps))
    start = decay_start if a.schedule == "wsd" else a.warmup
    if step < start: return a.lr
    progress = (step - start) / (a.steps - start) if a.steps > start else 1.0
    left = 1.0 - progress if a.schedule == "wsd" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return a.min_lr + left * (a.lr - a.min_lr)


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(train="", val="", init_out="", metrics="", schedule="wsd", device="cuda", dtype="bf16").items():
        ap.add_argument("--" + k, default=v)
    for k, v in dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, micro_batch=16, batch_tokens=65536, steps=400,
                     block_size=0, warmup=20, eval_every=50, eval_steps=8, seed=1337).items():
        ap.add_argument("--" + k, type=int, default=v)
    for k, v in dict(lr=6e-4, min_lr=6e-5, decay_frac=0.2, muon_lr=0.02, muon_momentum=0.95, weight_decay=0.1,
                     beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0).items():
        ap.add_argument("--" + k, type=float, default=v)
    a = ap.parse_args()
    a.block_size = a.block_size or a.seq_len
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = GPT(a.n_layer, a.n_embd, a.n_head, 50257, a.block_size).to(dev)
    os.makedirs(a.init_out, exist_ok=True)
    save_safetensors(model.hf_state_dict(), os.path.join(a.init_out, "model.safetensors"))
    with open(os.path.join(a.init_out, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd,
                   "vocab_size": 50257, "n_positions": a.block_size, "n_ctx": a.block_size,
                   "activation_function": "gelu_new", "tie_word_embeddings": True}, f)
    if a.metrics == "":
        return  # weights only

    matrices = [p for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2]
    ids = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if id(p) not in ids]
    adamw = torch.optim.AdamW([{"params": [p for p in rest if p.dim() >= 2], "weight_decay": a.weight_decay},
                               {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
                              lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    muon = torch.optim.Muon(matrices, lr=a.muon_lr, momentum=a.muon_momentum, nesterov=True,
                            weight_decay=a.weight_decay)
    train = h5py.File(a.train, "r")["tokens"]; val = h5py.File(a.val, "r")["tokens"]
    T, mb = a.seq_len, a.micro_batch
    accum = a.batch_tokens // (mb * T)
    windows = (train.shape[0] - 1) // T
    val_windows = (val.shape[0] - 1) // T
    order = WindowOrder(windows, a.seed)  # gpt2-train's sampler seed is train.seed, 1337 in the configs
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def batch(tokens, starts):
        rows = np.stack([tokens[s:s + T + 1].astype(np.int64) for s in starts])
        t = torch.from_numpy(rows).to(dev)
        return t[:, :-1], t[:, 1:]

    def evaluate():
        model.eval(); total = 0.0
        with torch.no_grad(), autocast:
            for e in range(a.eval_steps):
                total += model(*batch(val, [(e * mb + r) % val_windows * T for r in range(mb)])).item()
        model.train()
        return total / a.eval_steps

    with open(a.metrics, "w") as out:
        for step in range(a.steps):
            if a.eval_every > 0 and step % a.eval_every == 0:
                out.write(json.dumps({"step": step, "val_loss": evaluate()}) + "\n")
            loss_sum, t0 = 0.0, time.perf_counter()
            for m in range(accum):
                first = (step * accum + m) * mb  # global sample index of row 0 (one rank)
                with autocast:
                    loss = model(*batch(train, [order.window(first + r) * T for r in range(mb)])) / accum
                loss.backward(); loss_sum += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            scale = lr_at(step, a) / a.lr
            for g in adamw.param_groups: g["lr"] = a.lr * scale
            for g in muon.param_groups: g["lr"] = a.muon_lr * scale
            adamw.step(); muon.step(); adamw.zero_grad(set_to_none=True); muon.zero_grad(set_to_none=True)
            if dev.type == "cuda": torch.cuda.synchronize()
            ms = 1000 * (time.perf_counter() - t0)
            out.write(json.dumps({"step": step, "loss": loss_sum, "ms_per_step": ms}) + "\n"); out.flush()
        out.write(json.dumps({"step": a.steps, "val_loss": evaluate()}) + "\n")


if __name__ == "__main__":
    main()
