#!/usr/bin/env python3
"""Scaling on paper: gpt2-dist's data-parallel step from 1 to 1,024 GPUs, calibrated on measured
2xH200 points (docs/SCALING.md shows the output and says what each input rests on).

The model follows what the trainer does (src/train/trainer.cpp, parallel/grad_buckets.cpp):
  - Parameters sit in a flat buffer in reverse registration order; gradient buckets are consecutive
    parameters, a new one started once the current one holds >= bucket_mb; the padding rides last.
  - Backward produces gradients from the head down to block 0, then the embeddings; wte (tied to
    the head) is final only after the embedding's backward, so the last bucket waits for the end.
  - A bucket is reduced on one comm stream as soon as its last gradient arrives, in index order.
    ZeRO 0/1 all-reduce, ZeRO 2 reduce-scatters (its buckets are fixed-size blocks of the flat space,
    Note [Interleaved shards]; priced here with the same parameter-boundary buckets, a close count).
  - After backward: the rest of the reductions (exposed), the optimizer (one memory-bound pass,
    30 bytes per element of the shard), and for ZeRO 1/2 an all-gather of the bf16 parameters.
Per-step compute comes from measured one-GPU steps (bench/results); within backward it is
apportioned by FLOPs. Collectives: alpha + bytes * (ring factor) / bus bandwidth, NCCL's bus
bandwidth definition, ring or tree whichever is faster, with published bus bandwidths (NVLink 4
inside a node, 400 Gb/s per GPU across nodes). Three constants are fitted on the measured 2xH200
runs: a fixed cost per step of running distributed (the host meetings, the norm's all-gather, the
final wait), a cost per bucket (hook, launch, wait), and the share of overlapped communication time
that slows the compute it overlaps (NCCL kernels take SMs and HBM bandwidth).

  python3 bench/scaling_model.py                 # markdown tables on stdout
  python3 bench/scaling_model.py --svg FILE      # also the efficiency plot
"""
import argparse
import math

T = 1024                 # sequence length of every measurement
VOCAB = 50304            # padded vocabulary (model.vocab_size 50257 rounded up to 64)
HBM = 4.8e12 * 0.8       # H200 HBM3e, bytes/s, at 80% of the 4.8 TB/s peak (the optimizer pass)
NVLINK_BUS = 360e9       # NVLink 4 (450 GB/s per GPU per direction): NCCL all-reduce bus bandwidth ~80% of it
NIC = 400e9 / 8 * 0.9    # 400 Gb/s per GPU across nodes, at 90%: the ring's bus bandwidth there
HOP = {"nvlink": 2e-6, "net": 8e-6}  # per-hop latency of a collective step (assumed, NCCL-like)
GPUS_PER_NODE = 8

# name: (n_layer, n_embd, micro-batch per GPU, one-GPU ms/step) of bench/speed.sh's rows,
# bench/results/2026-12-04-speed-one-call-h200.log (main at 4cfd879).
SIZES = {"124m": (12, 768, 32, 57.4), "350m": (24, 1024, 16, 78.5), "774m": (36, 1280, 16, 164.4),
         "1558m": (48, 1600, 8, 174.3)}

# The calibration: bench/results/2026-12-01-scaling-2xh200.log, gpt2-124m B=32 bf16, fp32 gradient
# buffer, ZeRO 0, NCCL on 2 H200s; the one-GPU step of that day's build and bucket_mb -> ms/step
# (and the bucket count the log states, which the layout model must reproduce).
CALIBRATION = {"one_gpu_ms": 105.9, "runs": {1: (115.8, 50), 5: (115.3, 37), 25: (111.3, 13), 100: (108.6, 4)}}


def parameters(n_layer, n_embd):
    """(name, numel, block or None) in registration order (Hugging Face's GPT-2 names)."""
    c = n_embd
    out = [("wte", VOCAB * c, None), ("wpe", T * c, None)]
    for b in range(n_layer):
        out += [(f"h{b}.ln_1.w", c, b), (f"h{b}.ln_1.b", c, b), (f"h{b}.c_attn.w", 3 * c * c, b),
                (f"h{b}.c_attn.b", 3 * c, b), (f"h{b}.attn.c_proj.w", c * c, b), (f"h{b}.attn.c_proj.b", c, b),
                (f"h{b}.ln_2.w", c, b), (f"h{b}.ln_2.b", c, b), (f"h{b}.c_fc.w", 4 * c * c, b),
                (f"h{b}.c_fc.b", 4 * c, b), (f"h{b}.mlp.c_proj.w", 4 * c * c, b), (f"h{b}.mlp.c_proj.b", c, b)]
    return out + [("ln_f.w", c, None), ("ln_f.b", c, None)]


def ready_fractions(n_layer, n_embd):
    """Each parameter's gradient-ready time as a fraction of backward, in flat (reverse) order.
    Backward FLOPs per token: head 2 * 2VC; a block 2 * (24C^2 + 4TC) spread over its matmuls in
    backward order (the attention core's 4TC before c_attn), the rest (norms, biases) at their
    matmul; the embedding last and free."""
    c = n_embd
    head, block_attn = 2 * VOCAB * c, 4 * T * c
    block = 24 * c * c + block_attn
    total = head + n_layer * block
    t = head  # the head's backward runs first; ln_f is final after it
    ready = {"ln_f.w": t / total, "ln_f.b": t / total}
    for b in reversed(range(n_layer)):
        for names, work in ((["mlp.c_proj.w", "mlp.c_proj.b"], 8 * c * c), (["c_fc.w", "c_fc.b", "ln_2.w", "ln_2.b"], 8 * c * c),
                            (["attn.c_proj.w", "attn.c_proj.b"], 2 * c * c),
                            (["c_attn.w", "c_attn.b", "ln_1.w", "ln_1.b"], 6 * c * c + block_attn)):
            t += work
            for n in names:
                ready[f"h{b}.{n}"] = t / total
    ready["wpe"] = ready["wte"] = 1.0
    return [(name, numel, ready[name]) for name, numel, _ in reversed(parameters(n_layer, n_embd))]


def buckets(n_layer, n_embd, bucket_mb, grad_bytes):
    """[(bytes, ready fraction)] as GradBuckets cuts them: consecutive parameters, a new bucket once
    the current one holds >= bucket_mb."""
    out = []
    for name, numel, ready in ready_fractions(n_layer, n_embd):
        if not out or out[-1][0] >= bucket_mb * 2**20:
            out.append([0, 0.0])
        out[-1][0] += numel * grad_bytes
        out[-1][1] = max(out[-1][1], ready)
    return [tuple(b) for b in out]


def collective_s(kind, nbytes, n, nvlink_bus=NVLINK_BUS):
    """Seconds for an NCCL collective of nbytes over n GPUs: ring or tree, the faster. kind:
    all_reduce moves 2(n-1)/n of the bytes per GPU, reduce_scatter and all_gather (n-1)/n."""
    if n == 1:
        return 0.0
    nodes = math.ceil(n / GPUS_PER_NODE)
    bus, hop = (nvlink_bus, HOP["nvlink"]) if nodes == 1 else (NIC, HOP["net"])
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    ring = steps * hop + nbytes * factor / bus
    tree = 2 * math.ceil(math.log2(n)) * hop + nbytes * factor / bus  # same bytes, log-depth latency
    return min(ring, tree)


def step_ms(size, n, zero=0, bucket_mb=25, grad_bytes=4, k=None, one_gpu_ms=None):
    """(ms per step, what limits it) for `size` on n GPUs; k: the fitted constants."""
    k = k or FIT
    n_layer, n_embd, _, measured = SIZES[size]
    one = (one_gpu_ms or measured) / 1e3
    numel = sum(p[1] for p in parameters(n_layer, n_embd))
    optimizer = 30 * numel / HBM
    compute = one - optimizer
    backward = compute * 2 / 3
    forward_end = compute - backward
    kind = "reduce_scatter" if zero == 2 else "all_reduce"
    comm_end, overlapped, bks = forward_end, 0.0, buckets(n_layer, n_embd, bucket_mb, grad_bytes)
    for nbytes, ready in bks:
        start = max(forward_end + ready * backward, comm_end)
        comm_end = start + collective_s(kind, nbytes, n)
        overlapped += max(0.0, min(comm_end, compute) - start)
    exposed = max(0.0, comm_end - compute)
    fixed = k["per_step_s"] + k["per_bucket_s"] * len(bks) if n > 1 else 0.0
    opt = optimizer / n if zero >= 1 else optimizer
    gather = collective_s("all_gather", 2 * numel, n) if zero >= 1 else 0.0
    parts = {"compute": compute, "slowed by overlap": k["interference"] * overlapped,
             "exposed communication": exposed + gather, "fixed costs": fixed, "optimizer": opt}
    losses = {key: v for key, v in parts.items() if key != "compute"}
    return 1e3 * sum(parts.values()), max(losses, key=losses.get), parts


def fit():
    """The three constants by least squares on the calibration runs: for each interference share
    on a grid, the per-step and per-bucket costs are linear (closed form); the best non-negative fit."""
    zero = {"per_step_s": 0.0, "per_bucket_s": 0.0, "interference": 0.0}
    rows = []
    for mb, (ms, _) in CALIBRATION["runs"].items():
        _, _, parts = step_ms("124m", 2, 0, mb, 4, zero, CALIBRATION["one_gpu_ms"])
        rows.append((ms / 1e3 - sum(parts.values()), len(buckets(12, 768, mb, 4)), parts["slowed by overlap"]))
    best = None
    for g in [x / 200 for x in range(0, 201)]:
        # overhead - g * overlapped = a + b * buckets: ordinary least squares in (a, b)
        pts = [(nb, over - g * ov) for over, nb, ov in rows]
        mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        sxx = sum((p[0] - mx) ** 2 for p in pts)
        b = max(0.0, sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx)
        a = max(0.0, my - b * mx)
        err = sum((a + b * nb - y) ** 2 for nb, y in pts)
        if best is None or err < best[0]:
            best = (err, {"per_step_s": a, "per_bucket_s": b, "interference": g})
    return best[1]


FIT = None


def markdown():
    out = ["## Calibration (2xH200, gpt2-124m B=32, fp32 gradients, ZeRO 0)", "",
           f"Published: NVLink bus bandwidth {NVLINK_BUS / 1e9:.0f} GB/s, {NIC / 1e9:.0f} GB/s per GPU between nodes. "
           f"Fitted: {FIT['per_step_s'] * 1e3:.2f} ms per step, {FIT['per_bucket_s'] * 1e6:.0f} us per bucket, "
           f"{FIT['interference']:.3f} of the overlapped communication time slows the compute.", "",
           "| bucket_mb | buckets (log / model) | measured ms/step | model ms/step | error | efficiency (measured) |",
           "|---|---|---|---|---|---|"]
    for mb, (ms, count) in CALIBRATION["runs"].items():
        model = step_ms("124m", 2, 0, mb, 4, FIT, CALIBRATION["one_gpu_ms"])[0]
        n = len(buckets(12, 768, mb, 4))
        out.append(f"| {mb} | {count} / {n} | {ms:.1f} | {model:.1f} | {100 * (model / ms - 1):+.1f}% | "
                   f"{CALIBRATION['one_gpu_ms'] / ms:.3f} |")
    out += ["", "## Prediction (bucket_mb 25, fp32 gradient buffer; tokens/s over all GPUs; efficiency "
            "against N x one GPU)", "",
            "| size | ZeRO | GPUs | ms/step | tokens/s | efficiency | largest loss | exposed comm ms | optimizer ms |",
            "|---|---|---|---|---|---|---|---|---|"]
    for size, (n_layer, n_embd, B, one) in SIZES.items():
        for zero in (0, 1, 2):
            for n in (1, 2, 8, 64, 1024):
                ms, limit, parts = step_ms(size, n, zero)
                tok = B * T * n / (ms / 1e3)
                out.append(f"| {size} | {zero} | {n} | {ms:.1f} | {tok:,.0f} | {one / ms:.3f} | "
                           f"{limit if n > 1 else '-'} | {parts['exposed communication'] * 1e3:.1f} | "
                           f"{parts['optimizer'] * 1e3:.1f} |")
    out += ["", "## Bucket size (ZeRO 0, 8 and 64 GPUs: efficiency)", "", "| size | GPUs | " +
            " | ".join(f"{mb} MiB" for mb in (5, 25, 50, 100, 200)) + " |", "|---|---|" + "---|" * 5]
    for size, (_, _, _, one) in SIZES.items():
        for n in (8, 64):
            out.append(f"| {size} | {n} | " + " | ".join(f"{one / step_ms(size, n, 0, mb)[0]:.3f}"
                                                      for mb in (5, 25, 50, 100, 200)) + " |")
    return "\n".join(out)


def svg(path):
    """Efficiency against GPUs (log2 axis), one line per size, ZeRO 0, bucket_mb 25."""
    w, h, left, top = 640, 360, 60, 20
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    x = lambda n: left + (w - left - 20) * math.log2(n) / 10
    y = lambda e: top + (h - top - 40) * (1 - e)
    colors = {"124m": "#1f77b4", "350m": "#ff7f0e", "774m": "#2ca02c", "1558m": "#d62728"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<rect width="{w}" height="{h}" fill="white"/>']
    for e in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" y1="{y(e):.1f}" x2="{w - 20}" y2="{y(e):.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 8}" y="{y(e) + 4:.1f}" text-anchor="end">{e:.2f}</text>')
    for n in ns:
        parts.append(f'<text x="{x(n):.1f}" y="{h - 22}" text-anchor="middle">{n}</text>')
    parts.append(f'<text x="{(w + left) / 2:.0f}" y="{h - 6}" text-anchor="middle">GPUs (H200, 8 per node, '
                 '400 Gb/s per GPU between nodes)</text>')
    for i, (size, (_, _, _, one)) in enumerate(SIZES.items()):
        pts = " ".join(f"{x(n):.1f},{y(one / step_ms(size, n, 0)[0]):.1f}" for n in ns)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colors[size]}" stroke-width="2"/>')
        parts.append(f'<text x="{left + 10}" y="{top + 14 + 14 * i}" fill="{colors[size]}">gpt2-{size}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    global FIT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--svg", help="write the efficiency plot here")
    args = ap.parse_args()
    FIT = fit()
    print(markdown())
    if args.svg:
        svg(args.svg)


if __name__ == "__main__":
    main()
