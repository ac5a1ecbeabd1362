"""gpt2-data's inputs and outputs end to end, checked independently with h5py, numpy and tiktoken:
globs, JSON lines (tokens equal tiktoken's), llm.c and nanoGPT .bin shards (tokens copied through),
sharded output (shards concatenate to the single-file stream; stale outputs removed), the progress
line and summary, and malformed inputs: each exits 2 with a message naming the file (and line), and
nothing crashes. Run by CTest (env GPT2_BIN_DIR, GPT2_SOURCE_DIR)."""
import glob
import json
import os
import tempfile

import h5py
import numpy as np

from test_tokenizer_tiktoken import load_local_tiktoken
from checks import check, finish, gpt2_data

EOT = 50256


def tokens(path):
    with h5py.File(path, "r") as f:
        return f["tokens"][:].astype(np.int64)


def split_stream(out, split):
    paths = sorted(glob.glob(os.path.join(out, split + "*.h5")))
    return paths, (np.concatenate([tokens(p) for p in paths]) if paths else np.zeros(0, np.int64))


def llmc(toks, magic=20240520, version=1, count=None):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = magic, version, len(toks) if count is None else count
    return header.tobytes() + np.asarray(toks, dtype="<u2").tobytes()


def write(path, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return path


def main():
    enc = load_local_tiktoken()
    with tempfile.TemporaryDirectory() as d:
        # ---- JSON lines: one document per line, tokens equal tiktoken's, blank lines skipped
        docs = ["Hello world.\n", "caf\u00e9 \u65e5\u672c \U0001f680", "a \"quoted\" line\twith tabs", "   ", "last"]
        lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(docs)]
        jl = write(os.path.join(d, "c.jsonl"), "\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n")
        out = os.path.join(d, "jl")
        rc, log = gpt2_data([jl, "--out", out, "--val_fraction", "0"])
        check(rc == 0, "jsonl exits 0 (%d)\n%s" % (rc, log))
        expected = []
        for t in docs:
            if t.strip():
                expected += enc.encode_ordinary(t) + [EOT]
        check(tokens(os.path.join(out, "train.h5")).tolist() == expected, "jsonl: tokens equal tiktoken's + EOT")
        check("progress: " in log and "100%" in log, "final progress line printed")
        check("bytes/token" in log and "MB/s" in log and "4 documents" in log, "summary printed")

        # ---- globs: sorted matches, a directory match walked, quoted pattern given as one argument
        gdir = os.path.join(d, "g")
        os.makedirs(os.path.join(gdir, "sub"))
        write(os.path.join(gdir, "b.txt"), "second file")
        write(os.path.join(gdir, "a.txt"), "first file")
        write(os.path.join(gdir, "skip.md"), "not matched")
        out = os.path.join(d, "glob")
        rc, log = gpt2_data([os.path.join(gdir, "*.txt"), "--out", out, "--val_fraction", "0"])
        check(rc == 0, "glob exits 0 (%d)\n%s" % (rc, log))
        want = enc.encode_ordinary("first file") + [EOT] + enc.encode_ordinary("second file") + [EOT]
        check(tokens(os.path.join(out, "train.h5")).tolist() == want, "glob: matches read in sorted order")

        # ---- .bin: llm.c shards (EOT first) and a nanoGPT raw file, copied through unchanged
        rng = np.random.default_rng(0)
        stream = []
        for _ in range(300):
            stream += [EOT] + rng.integers(0, EOT, size=int(rng.integers(1, 60))).tolist()
        s1 = write(os.path.join(d, "fw_000.bin"), llmc(stream[:4000]))
        s2 = write(os.path.join(d, "fw_001.bin"), llmc(stream[4000:]))
        out = os.path.join(d, "bin")
        rc, log = gpt2_data([os.path.join(d, "fw_*.bin"), "--out", out, "--val_fraction", "0.1", "--seed", "5"])
        check(rc == 0, "llm.c shards exit 0 (%d)\n%s" % (rc, log))
        _, train = split_stream(out, "train")
        _, val = split_stream(out, "val")
        check(len(train) + len(val) == len(stream) + 1, "llm.c: every token kept, one EOT added at the end")
        check(len(val) > 0 and len(train) > len(val), "llm.c: documents split between train and val")
        # Documents are the runs ending in EOT; train and val interleave back to the stream.
        runs, cur = [], []
        for t in stream + [EOT]:
            cur.append(t)
            if t == EOT:
                runs.append(cur)
                cur = []
        merged, i, j = [], 0, 0
        tl, vl = train.tolist(), val.tolist()
        for r in runs:
            if tl[i:i + len(r)] == r:
                i += len(r)
            elif vl[j:j + len(r)] == r:
                j += len(r)
            else:
                break
            merged += r
        check(merged == stream + [EOT], "llm.c: train and val are the stream's documents, in order")
        raw_stream = rng.integers(0, EOT, size=999).tolist() + [EOT]
        raw = write(os.path.join(d, "nano.bin"), np.asarray(raw_stream, dtype="<u2").tobytes())
        out = os.path.join(d, "raw")
        rc, log = gpt2_data([raw, "--out", out, "--val_fraction", "0"])
        check(rc == 0 and tokens(os.path.join(out, "train.h5")).tolist() == raw_stream,
              "nanoGPT raw .bin: tokens copied exactly (%d)\n%s" % (rc, log[-500:]))
        rc, _ = gpt2_data([raw, "--out", out, "--val_fraction", "0", "--bin_format", "raw"])
        check(rc == 0 and tokens(os.path.join(out, "train.h5")).tolist() == raw_stream, "--bin_format raw")

        # ---- sharding: same stream as one file; stale outputs removed both ways
        texts = [write(os.path.join(d, "t%02d.txt" % i), ("Document %d. " % i) * (20 + i)) for i in range(30)]
        one = os.path.join(d, "one")
        rc, _ = gpt2_data(texts + ["--out", one, "--val_fraction", "0.2"])
        check(rc == 0, "unsharded run exits 0")
        sharded = os.path.join(d, "sharded")
        os.makedirs(sharded)
        write(os.path.join(sharded, "train.h5"), b"stale")
        write(os.path.join(sharded, "val_000009.h5"), b"stale")
        rc, log = gpt2_data(texts + ["--out", sharded, "--val_fraction", "0.2", "--shard_tokens", "150"])
        check(rc == 0, "sharded run exits 0 (%d)\n%s" % (rc, log[-800:]))
        for split in ("train", "val"):
            paths, stream_s = split_stream(sharded, split)
            names = [os.path.basename(p) for p in paths]
            check(names == ["%s_%06d.h5" % (split, k) for k in range(len(names))] and len(names) >= 2,
                  "%s: numbered shards %s" % (split, names))
            check(all(len(tokens(p)) == 150 for p in paths[:-1]) and 0 < len(tokens(paths[-1])) <= 150,
                  "%s: every shard but the last holds --shard_tokens" % split)
            check(np.array_equal(stream_s, tokens(os.path.join(one, split + ".h5"))),
                  "%s: shards concatenate to the single-file stream" % split)
        check("removed stale" in log, "stale outputs reported")
        rc, _ = gpt2_data(texts + ["--out", sharded, "--val_fraction", "0.2"])
        check(sorted(os.listdir(sharded)) == ["train.h5", "val.h5"], "back to one shard: numbered shards removed")

        # ---- malformed inputs: exit 2, the message names the file (and line); never a crash
        def bad(name, args, needles):
            rc, log = gpt2_data(args + ["--out", os.path.join(d, "x")])
            last = log.strip().splitlines()[-1] if log.strip() else ""
            check(rc == 2 and all(n in last for n in needles),
                  "%s: exit 2 naming %s (%d: %s)" % (name, needles, rc, last[-300:]))

        bad("glob matching nothing", [os.path.join(d, "nothing*.txt")], ["nothing*.txt", "matches no files"])
        bjl = write(os.path.join(d, "bad.jsonl"), lines[0] + "\n" + '{"text": "unterminated}\n')
        bad("bad JSON line", [bjl], [bjl + ":2:", "missing closing quote"])
        njl = write(os.path.join(d, "notext.jsonl"), '{"body": "x"}\n')
        bad("JSON line without text", [njl], [njl + ":1:", '"text"'])
        ajl = write(os.path.join(d, "array.jsonl"), '["text"]\n')
        bad("JSON line not an object", [ajl], [ajl + ":1:", "expected a JSON object"])
        tjl = write(os.path.join(d, "num.jsonl"), '{"text": 12}\n')
        bad("JSON text not a string", [tjl], [tjl + ":1:", "is not a string"])
        b = write(os.path.join(d, "magic.bin"), llmc([1, 2], magic=7))
        bad(".bin bad magic (--bin_format llmc)", [b, "--bin_format", "llmc"], [b, "no llm.c header"])
        b = write(os.path.join(d, "version.bin"), llmc([1, 2], version=2))
        bad(".bin bad version", [b], [b, "version 2 is not supported"])
        b = write(os.path.join(d, "count.bin"), llmc([1, 2], count=5))
        bad(".bin count disagrees with size", [b], [b, "header says 5 tokens"])
        b = write(os.path.join(d, "ids.bin"), llmc([1, 2, 60000]))
        bad(".bin id >= vocab", [b], [b, "position 2 is 60000"])
        b = write(os.path.join(d, "odd.bin"), b"\x01\x00\x02")
        bad(".bin odd size", [b], [b, "odd size"])
        b = write(os.path.join(d, "empty.bin"), b"")
        bad(".bin empty", [b], [b, "empty .bin file"])
        b = write(os.path.join(d, "head.bin"), llmc([1])[:500])
        bad(".bin truncated header", [b], [b, "truncated llm.c header"])
        bad("bad --bin_format", [raw, "--bin_format", "nanogpt"], ["--bin_format nanogpt"])
        bad("bad --shard_tokens", [raw, "--shard_tokens", "0"], ["--shard_tokens 0"])
        blank = write(os.path.join(d, "blank.jsonl"), "\n\n")
        bad("no documents", [blank], ["no documents"])
        # A run that fails midway leaves the earlier outputs as they were and no staging files.
        before = tokens(os.path.join(one, "train.h5"))
        rc, log = gpt2_data(texts + [bjl, "--out", one, "--shard_tokens", "150"])
        check(rc == 2 and np.array_equal(tokens(os.path.join(one, "train.h5")), before)
              and sorted(os.listdir(one)) == ["train.h5", "val.h5"],
              "failed run: earlier outputs untouched, staging removed (%d, %s)" % (rc, sorted(os.listdir(one))))
        outfile = write(os.path.join(d, "a_file"), "x")
        rc, log = gpt2_data([raw, "--out", outfile])
        check(rc == 2 and outfile in log, "--out is a file: exit 2 naming it (%d)" % rc)

    finish()


if __name__ == "__main__":
    main()
