"""Kernel time per step by kind from a gpt2-train Kineto trace (trace_rankR.json[.gz]), and the
TOP (default 0) kernels by time:
  python3 bench/trace_summary.py TRACE STEPS [TOP]
Matmuls, attention, LayerNorm, GELU, reductions, the fused loss, copies, the optimizer and other
elementwise kernels; plus the GPU's busy time against the window it spans."""
import collections, gzip, json, sys

path, steps = sys.argv[1], int(sys.argv[2])
top = int(sys.argv[3]) if len(sys.argv) > 3 else 0
opener = gzip.open if path.endswith(".gz") else open
events = json.load(opener(path, "rt"))["traceEvents"]
kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]


def kind(n):
    low = n.lower()
    if "nvjet" in n or "gemm" in low or "cutlass" in low or "splitkreduce" in low: return "matmul"
    if "sdpa" in low or "flash" in low or "fmha" in low or "cudnn" in low: return "attention"
    if "layer_norm" in low or "gammabeta" in low: return "layernorm (+ residual adds)"
    if "cross_entropy" in n: return "fused cross-entropy"
    if "bias_grad_kernel" in n or "finish_column_sums" in n: return "bias grads (+ GELU backward)"
    if "adam" in low or "multi_tensor" in low: return "optimizer"
    if "reduce_kernel" in n: return "reductions (bias grads, norms)"
    if "gelu" in low: return "gelu"
    if "copy" in low: return "copies / casts"
    return "other elementwise (residual adds, ...)"


by_kind = collections.Counter()
for e in kernels:
    by_kind[kind(e["name"])] += e["dur"]
span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
busy = sum(by_kind.values())
print(f"kernels per step: {len(kernels) / steps:.0f}; busy {busy / 1e3 / steps:.2f} ms/step of a "
      f"{span / 1e3 / steps:.2f} ms/step span")
for k, d in by_kind.most_common():
    print(f"  {k:40s} {d / 1e3 / steps:7.2f} ms/step  {100 * d / busy:5.1f}%")

by_name, calls = collections.Counter(), collections.Counter()
for e in kernels:
    by_name[e["name"]] += e["dur"]
    calls[e["name"]] += 1
for n, d in by_name.most_common(top):
    print(f"  {d / 1e3 / steps:7.3f} ms/step {calls[n] / steps:6.1f}x  {kind(n):32.32s} {n[:110]}")
