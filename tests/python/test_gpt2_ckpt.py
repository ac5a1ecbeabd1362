"""gpt2-ckpt on a real checkpoint: 2 CPU ranks (mpiexec) train a tiny model 5 steps with ZeRO-1 and
save; the checkpoint is the manifest and the optimizer shards, no model file. Then, without MPI,
inspect names the step and world size, verify passes, and consolidate's weights equal an
independent numpy reassembly of the shards' fp32 masters; file sizes and CRC-32Cs are checked
against a pure-Python CRC-32C. gpt2-generate, gpt2-eval and export-hf give the same result from the
checkpoint as from its consolidated model file, and a second identical run writes the same shard
tensors. A run with 8-bit moments writes shards whose datasets match block counts computed here,
inspect shows the format, and verify names a bad scale. An old-style checkpoint (one that lists a model.h5, as writers before this one did) still
verifies, loads, and has its model.h5 checked. Damage (a flipped byte, a truncation, a missing
manifest, HDF5 contents that disagree with the manifest) must give exit 1 (2 when it is no
checkpoint) naming the file, and consolidate must write nothing.
Run by CTest (env GPT2_BIN_DIR, GPT2_SOURCE_DIR)."""
import json, os, shutil, subprocess, tempfile
import h5py, numpy as np
from checks import check, finish, write_tokens

SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
TRAIN = os.path.join(BIN_DIR, "gpt2-train")
CKPT = os.path.join(BIN_DIR, "gpt2-ckpt")
GENERATE = os.path.join(BIN_DIR, "gpt2-generate")
EVAL = os.path.join(BIN_DIR, "gpt2-eval")

# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), independent of src/base/crc32c.cpp.
_T = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _T.append(_c)

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _T[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF

def tool(exe, args, timeout=120):
    p = subprocess.run([exe] + args, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=SRC)
    return p.returncode, p.stdout + p.stderr

def ckpt(args, timeout=120):
    return tool(CKPT, args, timeout)

def reseal(d, name):
    """After editing `name` in checkpoint d, record its new size and CRC-32C in the manifest."""
    mf = os.path.join(d, "manifest.json")
    m = json.load(open(mf))
    data = open(os.path.join(d, name), "rb").read()
    for f in m["files"]:
        if f["name"] == name:
            f["bytes"], f["crc32c"] = len(data), f"{crc32c(data):08x}"
    json.dump(m, open(mf, "w"))

def list_file(d, name):
    """Lists `name` (a file in checkpoint d) first among the manifest's files, with its size and CRC-32C."""
    mf = os.path.join(d, "manifest.json")
    m = json.load(open(mf))
    data = open(os.path.join(d, name), "rb").read()
    m["files"] = [{"name": name, "bytes": len(data), "crc32c": f"{crc32c(data):08x}"}] + \
        [f for f in m["files"] if f["name"] != name]
    json.dump(m, open(mf, "w"))

def expect_damage(d, needles, what):
    rc, out = ckpt(["verify", d])
    ok = rc == 1 and all(n in out for n in needles)
    check(ok, f"{what}: verify exits 1 naming {needles} (rc={rc})")
    if not ok: print(out[-2000:])

check(crc32c(b"123456789") == 0xE3069283, "the reference CRC-32C gives e3069283 for '123456789'")

with tempfile.TemporaryDirectory() as tmp:
    train = os.path.join(tmp, "train.h5")
    write_tokens(train, np.arange(20000) * 7 % 251)
    root = os.path.join(tmp, "ckpt")
    args = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=256",
            "--model.block_size=32", f"--data.train={train}", "--data.val=none", "--train.micro_batch=2",
            "--train.seq_len=16", "--train.batch_tokens=64", "--train.max_steps=5", "--train.sample_tokens=0",
            "--train.device=cpu", "--precision.dtype=fp32", "--log.metrics=none", "--parallel.zero_stage=1",
            f"--checkpoint.dir={root}", "--checkpoint.every=5"]
    mpi = ["mpiexec", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    p = subprocess.run(mpi + [TRAIN] + args, capture_output=True, text=True, errors="replace", timeout=300, cwd=SRC)
    d = os.path.join(root, "step_0000005")
    check(p.returncode == 0 and os.path.isfile(os.path.join(d, "manifest.json")),
          f"2 ranks train 5 steps and save {d} (rc={p.returncode})")
    if p.returncode != 0 or not os.path.isdir(d):
        print((p.stdout + p.stderr)[-3000:])
        finish()
    m = json.load(open(os.path.join(d, "manifest.json")))
    params = m["params"]

    # A checkpoint is the manifest and the shards: no model file (nothing read it).
    shard_files = [s["file"] for s in m["shards"]]
    check(sorted(os.listdir(d)) == sorted(["manifest.json"] + shard_files),
          f"the checkpoint directory holds manifest.json and the shards only: {sorted(os.listdir(d))}")
    check([f["name"] for f in m["files"]] == shard_files, f"the manifest lists the shards only: {m['files']}")

    # The manifest's sizes and checksums, recomputed independently.
    for f in m["files"]:
        data = open(os.path.join(d, f["name"]), "rb").read()
        check(len(data) == f["bytes"] and f"{crc32c(data):08x}" == f["crc32c"],
              f"{f['name']}: {len(data)} bytes, crc32c {crc32c(data):08x} as the manifest says")

    # ---- inspect (the root resolves to the newest step_*)
    rc, out = ckpt(["inspect", root])
    check(rc == 0 and d in out and "step: 5" in out and "world size: 2" in out and "ZeRO stage: 1" in out,
          f"inspect ROOT names {d}, step 5, world size 2, ZeRO 1 (rc={rc})")
    check(f"parameters: {m['flat_total']}" in out and all(f["crc32c"] in out for f in m["files"])
          and "optim_r00001.h5" in out and "model.n_embd = 32" in out,
          "inspect lists the parameter count, every file's crc32c, the shards and the model config")
    if rc != 0: print(out)
    rc, out = ckpt(["inspect", d, "--json"])
    try:
        j = json.loads(out)
    except ValueError:
        j = {}
    check(rc == 0 and j.get("step") == 5 and j.get("world_size") == 2 and j.get("files") == m["files"]
          and j.get("params") == params and j.get("shards") == m["shards"], f"inspect --json is the manifest (rc={rc})")

    # ---- verify
    rc, out = ckpt(["verify", d])
    total = sum(f["bytes"] for f in m["files"])
    check(rc == 0 and f"OK {d}: {len(m['files'])} files, {total} bytes" in out, f"verify: {out.strip()} (rc={rc})")

    # ---- consolidate, against a numpy reassembly of the shards' masters
    cons = os.path.join(tmp, "full.h5")
    rc, out = ckpt(["consolidate", root, "--out", cons])
    check(rc == 0 and os.path.isfile(cons) and not os.path.exists(cons + ".tmp"), f"consolidate writes {cons} (rc={rc})")
    if rc != 0: print(out)
    flat = np.full(m["flat_padded"], np.nan, dtype=np.float32)
    for s in m["shards"]:
        with h5py.File(os.path.join(d, s["file"]), "r") as f:
            check(int(f.attrs["begin"]) == s["begin"] and int(f.attrs["end"]) == s["end"], f"{s['file']}: begin/end attributes")
            flat[s["begin"]:s["end"]] = f["master"][...]
    check(not np.isnan(flat[:m["flat_total"]]).any(), "the shards cover the flat space")
    if os.path.isfile(cons):
        with h5py.File(cons, "r") as c:
            check(sorted(c.keys()) == sorted(p["name"] for p in params), f"{len(params)} datasets, one per parameter")
            shapes = all(c[p["name"]].shape == tuple(p["shape"]) and c[p["name"]].dtype == np.float32 for p in params)
            check(shapes, "every dataset is fp32 with the manifest's shape")
            same_flat = all(np.array_equal(c[p["name"]][...],
                                           flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"])) for p in params)
            check(same_flat, "equal to the numpy reassembly of the shards' masters exactly")
            check("transformer.h.0.attn.c_attn.weight" in c, "Hugging Face names")
            a = c.attrs
            check(a.get("format") == "gpt2-model" and int(a.get("step", -1)) == 5 and int(a.get("n_layer", -1)) == 2
                  and int(a.get("n_head", -1)) == 2 and int(a.get("n_embd", -1)) == 32
                  and int(a.get("vocab_size", -1)) == 256 and int(a.get("block_size", -1)) == 32,
                  f"root attributes format, step and model config: {dict(a)}")

    # ---- what reads weights reads the checkpoint as it reads its consolidated model file
    hf_ckpt, hf_model = os.path.join(tmp, "hf_ckpt"), os.path.join(tmp, "hf_model")
    rc1, out1 = ckpt(["export-hf", d, "--out", hf_ckpt])
    rc2, out2 = ckpt(["export-hf", cons, "--out", hf_model])
    same = rc1 == 0 and rc2 == 0 and "checkpoint" in out1 and "model file" in out2 and all(
        open(os.path.join(hf_ckpt, n), "rb").read() == open(os.path.join(hf_model, n), "rb").read()
        for n in ("model.safetensors", "config.json"))
    check(same, f"export-hf of the checkpoint equals export-hf of its consolidated file byte for byte (rc={rc1}, {rc2})")
    if not same: print(out1 + out2)
    gen = ["--ids", "--prompt", "7 14 21", "--temperature", "0", "--max_new_tokens", "12", "--ignore_eot",
           "--device", "cpu"]
    (rc1, out1), (rc2, out2) = tool(GENERATE, [root] + gen), tool(GENERATE, [cons] + gen)
    ids = out1.splitlines()[0] if rc1 == 0 and out1 else ""
    check(rc1 == 0 and rc2 == 0 and len(ids.split()) == 15 and ids == out2.splitlines()[0],
          f"gpt2-generate greedy from the checkpoint and from its model file: {ids} (rc={rc1}, {rc2})")
    ev = ["--data", train, "--seq_len", "16", "--windows", "8", "--device", "cpu"]
    (rc1, out1), (rc2, out2) = tool(EVAL, [d] + ev), tool(EVAL, [cons] + ev)
    loss = [l.rsplit(" | ", 1)[0] for l in (out1 + out2).splitlines() if l.startswith("loss ")]  # less the source
    check(rc1 == 0 and rc2 == 0 and len(loss) == 2 and loss[0] == loss[1],
          f"gpt2-eval of the checkpoint and of its model file print the same loss: {loss} (rc={rc1}, {rc2})")

    # ---- determinism: the same run again writes the same shard tensors (the shards also hold the
    # CPU generator's state, which differs by run)
    root2 = os.path.join(tmp, "ckpt2")
    p = subprocess.run(mpi + [TRAIN] + [a for a in args if not a.startswith("--checkpoint.dir=")] +
                       [f"--checkpoint.dir={root2}"], capture_output=True, text=True, errors="replace", timeout=300, cwd=SRC)
    d2 = os.path.join(root2, "step_0000005")
    same = p.returncode == 0
    for s in m["shards"] if same else []:
        with h5py.File(os.path.join(d, s["file"]), "r") as a, h5py.File(os.path.join(d2, s["file"]), "r") as b:
            same = same and all(np.array_equal(a[k][...], b[k][...]) for k in ("master", "exp_avg", "exp_avg_sq"))
    check(same, f"a second identical run writes the same masters and moments (rc={p.returncode})")

    # ---- an old-style checkpoint: writers before this one added model.h5 (a model file) and listed
    # it; it still verifies and loads, and its model.h5 is still checked against the manifest.
    def copy(name):
        out = os.path.join(tmp, name)
        shutil.copytree(d, out)
        return out

    def old_style(name):
        out = copy(name)
        shutil.copyfile(cons, os.path.join(out, "model.h5"))
        list_file(out, "model.h5")
        return out

    old = old_style("old")
    rc, out = ckpt(["verify", old])
    check(rc == 0 and f"OK {old}: {len(shard_files) + 1} files" in out, f"an old-style checkpoint verifies: {out.strip()} (rc={rc})")
    rc, out = tool(GENERATE, [old] + gen)
    check(rc == 0 and out.splitlines()[0] == ids, f"gpt2-generate reads an old-style checkpoint (rc={rc})")

    truncated = old_style("truncated")
    path = os.path.join(truncated, "model.h5")
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    expect_damage(truncated, ["model.h5", f"{size // 2} bytes", str(size)], "a truncated model.h5 of an old-style checkpoint")

    model_gone = old_style("model_gone")
    victim = params[len(params) // 2]["name"]
    with h5py.File(os.path.join(model_gone, "model.h5"), "r+") as f:
        del f[victim]
        data = f["transformer.wpe.weight"][...]
        del f["transformer.wpe.weight"]
        f.create_dataset("transformer.wpe.weight", data=data.reshape(-1))
    reseal(model_gone, "model.h5")
    expect_damage(model_gone, [f"model.h5: no dataset '{victim}'", "model.h5: 'transformer.wpe.weight' has shape"],
                  "an old-style model.h5 missing a parameter and one with a wrong shape")

    # ---- damage
    flipped = copy("flipped")
    path = os.path.join(flipped, "optim_r00001.h5")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(data)
    expect_damage(flipped, ["optim_r00001.h5", "checksum"], "a flipped byte")
    bad_out = os.path.join(tmp, "bad.h5")
    rc, out = ckpt(["consolidate", flipped, "--out", bad_out])
    check(rc == 1 and "optim_r00001.h5" in out and not os.path.exists(bad_out) and not os.path.exists(bad_out + ".tmp"),
          f"consolidate of a damaged checkpoint exits 1 and writes nothing (rc={rc})")

    truncated = copy("truncated_shard")
    path = os.path.join(truncated, "optim_r00000.h5")
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    expect_damage(truncated, ["optim_r00000.h5", f"{size // 2} bytes", str(size)], "a truncated shard")

    no_manifest = copy("no_manifest")
    os.remove(os.path.join(no_manifest, "manifest.json"))
    for cmd in (["verify"], ["inspect"], ["consolidate", "--out", bad_out]):
        rc, out = ckpt([cmd[0], no_manifest] + cmd[1:])
        check(rc == 2 and no_manifest in out and "not a checkpoint" in out and "missing" in out,
              f"{cmd[0]} without manifest.json: exit 2, 'not a checkpoint' (rc={rc})")
    check(not os.path.exists(bad_out), "still nothing written")

    # Contents that disagree with the manifest under valid checksums (the manifest resealed).
    shard0 = copy("shard0")
    with h5py.File(os.path.join(shard0, "optim_r00000.h5"), "r+") as f:
        f.attrs["end"] = int(f.attrs["end"]) + 1
        del f["exp_avg_sq"]
    reseal(shard0, "optim_r00000.h5")
    expect_damage(shard0, ["optim_r00000.h5: attribute end", "optim_r00000.h5: no dataset /exp_avg_sq"],
                  "a shard's attributes and datasets")

    gap = copy("gap")
    mg = json.load(open(os.path.join(gap, "manifest.json")))
    mg["shards"][1]["begin"] += 8
    json.dump(mg, open(os.path.join(gap, "manifest.json"), "w"))
    expect_damage(gap, ["in no shard", "optim_r00001.h5: attribute begin"], "a gap between the shards")

    # ---- 8-bit moments: inspect names the format, verify checks the datasets against block counts
    # computed here from the manifest's parameters (the 2048-element grid cut at parameter
    # boundaries; tensors under 4096 values keep fp32 moments), and a bad scale is damage.
    root8 = os.path.join(tmp, "ckpt8")
    args8 = [a for a in args if not a.startswith(("--checkpoint.dir", "--model.n_embd"))] + \
        [f"--checkpoint.dir={root8}", "--model.n_embd=64", "--memory.optimizer_moments=8bit"]
    p = subprocess.run(mpi + [TRAIN] + args8, capture_output=True, text=True, errors="replace", timeout=300, cwd=SRC)
    d8 = os.path.join(root8, "step_0000005")
    check(p.returncode == 0 and os.path.isdir(d8), f"2 ranks train 5 steps with 8-bit moments (rc={p.returncode})")
    if p.returncode != 0: print((p.stdout + p.stderr)[-3000:])
    rc, out = ckpt(["inspect", d8])
    check(rc == 0 and "optimizer moments: 8bit" in out, f"inspect shows 'optimizer moments: 8bit' (rc={rc})")
    rc, out = ckpt(["inspect", d])
    check(rc == 0 and "optimizer moments: fp32" in out, "and 'optimizer moments: fp32' for the fp32 checkpoint")
    rc, out = ckpt(["verify", d8])
    check(rc == 0 and out.startswith("OK "), f"verify passes the 8-bit checkpoint (rc={rc}): {out.strip()[:300]}")
    m8 = json.load(open(os.path.join(d8, "manifest.json")))
    blocks = []  # (begin, quantized, length) in flat order
    for q in sorted(m8["params"], key=lambda q: q["offset"]):
        pos, stop = q["offset"], q["offset"] + q["numel"]
        while pos < stop:
            ln = min((pos // 2048 + 1) * 2048, stop) - pos
            blocks.append((pos, q["numel"] >= 4096, ln))
            pos += ln
    sizes_ok = m8["optimizer_moments"] == "8bit"
    for s in m8["shards"]:
        inside = [b for b in blocks if s["begin"] <= b[0] < s["end"]]
        with h5py.File(os.path.join(d8, s["file"]), "r") as f:
            want = {"master": s["end"] - s["begin"], "exp_avg_codes": s["end"] - s["begin"],
                    "exp_avg_absmax": sum(1 for b in inside if b[1]),
                    "exp_avg_sq_fp32": sum(b[2] for b in inside if not b[1])}
            got = {k: f[k].shape[0] for k in want}
            sizes_ok = sizes_ok and got == want and f["exp_avg_codes"].dtype == np.uint8 and s["begin"] % 2048 == 0
            sizes_ok = sizes_ok and bool((f["exp_avg_sq_absmax"][...] >= 0).all()) and want["exp_avg_absmax"] > 0
    check(sizes_ok, "each 8-bit shard holds codes per element, an absmax per 8-bit block and fp32 moments per "
          "small-tensor element, as computed from the manifest")
    bad_scale = os.path.join(tmp, "bad_scale")
    shutil.copytree(d8, bad_scale)
    with h5py.File(os.path.join(bad_scale, "optim_r00001.h5"), "r+") as f:
        f["exp_avg_absmax"][1] = -1.0
    reseal(bad_scale, "optim_r00001.h5")
    expect_damage(bad_scale, ["optim_r00001.h5: /exp_avg_absmax[1] = -1, the scale of the 8-bit block of flat elements",
                              "is not a finite non-negative number"], "a negative 8-bit scale")

    # ---- ZeRO 2's interleaved shards (Note [Interleaved shards]): each shard is several flat ranges,
    # its datasets end to end over them (format_version 2, `ranges`). Reassembled here from the
    # ranges alone, the masters equal consolidate's model; ranges that overlap are named damage.
    # The run uses Muon, whose matrices are updated by their owner ranks (Note [Muon's owners]): the
    # owners' masters and momenta must be in the shards' ranges all the same.
    root_zero2 = os.path.join(tmp, "ckpt_zero2")
    argsz = [a for a in args if not a.startswith(("--checkpoint.dir", "--parallel.zero_stage"))] + \
        [f"--checkpoint.dir={root_zero2}", "--parallel.zero_stage=2", "--parallel.bucket_mb=0.01", "--optim.name=muon"]
    p = subprocess.run(mpi + [TRAIN] + argsz, capture_output=True, text=True, errors="replace", timeout=300, cwd=SRC)
    dz = os.path.join(root_zero2, "step_0000005")
    check(p.returncode == 0 and os.path.isdir(dz), f"2 ranks train 5 steps with ZeRO 2 (rc={p.returncode})")
    if p.returncode != 0: print((p.stdout + p.stderr)[-3000:])
    mz = json.load(open(os.path.join(dz, "manifest.json")))
    ranges = [r for s in mz["shards"] for r in s.get("ranges", [[s["begin"], s["end"]]])]
    check(mz["format_version"] == 2 and all(len(s.get("ranges", [])) > 1 for s in mz["shards"]),
          f"format_version 2, every shard several ranges ({[len(s.get('ranges', [])) for s in mz['shards']]})")
    check(sorted(ranges)[0][0] == 0 and all(a[1] == b[0] for a, b in zip(sorted(ranges), sorted(ranges)[1:]))
          and sorted(ranges)[-1][1] == mz["flat_padded"], "the ranges tile [0, flat_padded)")
    rc, out = ckpt(["verify", dz])
    check(rc == 0 and "OK" in out, f"verify passes (rc={rc})")
    rc, out = ckpt(["inspect", dz])
    check(rc == 0 and "ranges from" in out, f"inspect says how many ranges each shard holds (rc={rc})")
    check(rc == 0 and "optimizer: muon" in out, "and that the run used Muon")
    flatz = np.full(mz["flat_padded"], np.nan, dtype=np.float32)
    momentum = np.full(mz["flat_padded"], np.nan, dtype=np.float32)
    for s in mz["shards"]:
        with h5py.File(os.path.join(dz, s["file"]), "r") as f:
            master, mom, at = f["master"][...], f["muon_momentum"][...], 0
            check(len(master) == sum(e - b for b, e in s["ranges"]), f"{s['file']}: master covers its ranges")
            for b, e in s["ranges"]:
                flatz[b:e] = master[at:at + e - b]
                momentum[b:e] = mom[at:at + e - b]
                at += e - b
    is_muon = lambda p: p["name"].startswith("transformer.h.") and len(p["shape"]) == 2
    check(all(np.any(momentum[p["offset"]:p["offset"] + p["numel"]] != 0) == is_muon(p) for p in mz["params"]),
          "muon_momentum is nonzero in every block matrix and zero in every other parameter")
    consz = os.path.join(tmp, "full2.h5")
    rc, out = ckpt(["consolidate", dz, "--out", consz])
    check(rc == 0, f"consolidate of the ZeRO 2 checkpoint (rc={rc})")
    if rc == 0:
        with h5py.File(consz, "r") as c:
            check(all(np.array_equal(c[p["name"]][...], flatz[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"]))
                      for p in mz["params"]), "its model equals the masters reassembled from the ranges")
    overlap = os.path.join(tmp, "overlap")
    shutil.copytree(dz, overlap)
    mo = json.load(open(os.path.join(overlap, "manifest.json")))
    r0 = mo["shards"][0]["ranges"]
    r0[1] = [r0[1][0] - 2048, r0[1][1] - 2048]  # into rank 1's first range
    json.dump(mo, open(os.path.join(overlap, "manifest.json"), "w"))
    expect_damage(overlap, ["overlaps", "optim_r00000.h5"], "a shard range that overlaps another")
    malformed = os.path.join(tmp, "malformed")
    shutil.copytree(dz, malformed)
    mm = json.load(open(os.path.join(malformed, "manifest.json")))
    mm["shards"][1]["ranges"][0] = [mm["shards"][1]["ranges"][0][0]]
    json.dump(mm, open(os.path.join(malformed, "manifest.json"), "w"))
    rc, out = ckpt(["verify", malformed])
    check(rc != 0 and "optim_r00001.h5" in out and "range" in out, f"a range that is not [begin, end] is named (rc={rc})")

    # ---- usage errors: exit 2 naming the argument
    for a, needle in [([], "no command"), (["frobnicate", d], "frobnicate"), (["verify"], "PATH"),
                      (["consolidate", d], "--out"), (["inspect", d, "--bogus"], "--bogus"),
                      (["inspect", "/nonexistent/ckpt"], "/nonexistent/ckpt"), (["verify", d, d], "unexpected")]:
        rc, out = ckpt(a)
        check(rc == 2 and needle in out, f"gpt2-ckpt {' '.join(a[:1] + a[2:])}: exit 2 naming {needle!r} (rc={rc})")
    rc, out = ckpt(["--help"])
    check(rc == 0 and "consolidate" in out, "--help exits 0")

finish()
