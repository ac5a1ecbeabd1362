"""gpt2-data end to end, checked independently: h5py reads train.h5/val.h5 (uint16, contiguous, no
filters, attributes) and the tokens must equal tiktoken's encoding of the documents, each followed
by EOT, in order. Also the fortune directory as input, and exit code 2 for bad input.
Run by CTest (env GPT2_BIN_DIR, GPT2_SOURCE_DIR, GPT2_TEST_BIN_DIR)."""
import os
import tempfile

import h5py
import numpy as np

from test_tokenizer_tiktoken import FORTUNES_DIR, load_local_tiktoken
from checks import check, finish, gpt2_data



def split_docs(text, separator):
    """The documented rule: runs of lines between separator lines (a trailing \\r ignored);
    whitespace-only documents dropped."""
    if separator is None:
        docs = [text]
    else:
        docs, start, pos = [], 0, 0
        for line in text.splitlines(keepends=True):
            body = line[:-1] if line.endswith("\n") else line
            if body.endswith("\r"):
                body = body[:-1]
            if body == separator:
                docs.append(text[start:pos])
                start = pos + len(line)
            pos += len(line)
        docs.append(text[start:])
    return [d for d in docs if d.strip(" \t\r\n\v\f") != ""]


def read_split(path):
    with h5py.File(path, "r") as f:
        ds = f["tokens"]
        check(ds.dtype == np.uint16, "%s: dtype uint16 (got %s)" % (path, ds.dtype))
        check(ds.ndim == 1, "%s: 1-D" % path)
        check(ds.chunks is None and ds.compression is None, "%s: not chunked, no compression" % path)
        check(ds.id.get_offset() is not None, "%s: has a file offset (mmap-able)" % path)
        check(ds.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS, "%s: layout CONTIGUOUS" % path)
        check(ds.id.get_create_plist().get_nfilters() == 0, "%s: no filters" % path)
        attrs = dict(f.attrs)
        check(attrs.get("format") == "gpt2-tokens", "%s: format attr (%r)" % (path, attrs.get("format")))
        check(attrs.get("format_version") == 1, "%s: format_version 1" % path)
        check(attrs.get("vocab_size") == 50257, "%s: vocab_size 50257" % path)
        check(attrs.get("eot_token") == 50256, "%s: eot_token 50256" % path)
        check(attrs.get("tokenizer") == "gpt2", "%s: tokenizer gpt2 (%r)" % (path, attrs.get("tokenizer")))
        return ds[:].astype(np.int64).tolist()


def docs_of_stream(tokens, eot=50256):
    check(len(tokens) > 0 and tokens[-1] == eot, "stream ends with EOT")
    docs, cur = [], []
    for t in tokens:
        if t == eot:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs


def check_partition(expected, train, val, what):
    """train and val, each in order, must interleave to exactly `expected` (document order kept)."""
    i = j = 0
    for k, doc in enumerate(expected):
        if i < len(train) and train[i] == doc:
            i += 1
        elif j < len(val) and val[j] == doc:
            j += 1
        else:
            check(False, "%s: document %d is in neither split in order" % (what, k))
            return
    check(i == len(train) and j == len(val), "%s: %d train + %d val documents = %d, tokens equal tiktoken's"
          % (what, len(train), len(val), len(expected)))


def main():
    enc = load_local_tiktoken()
    with tempfile.TemporaryDirectory() as d:
        # ---- a few text files, % separated documents, some Unicode
        texts = {
            "a.txt": "First fortune.\n%\nSecond one, with caf\u00e9 and \u65e5\u672c\u8a9e.\n%\n   \n%\nThird: it's 42.\n",
            "b.txt": "Another file\r\n%\r\nwith CRLF lines \U0001f680\r\n",
            "c.txt": "".join("Document number %d says hello %s.\n%%\n" % (i, "x" * i) for i in range(40)),
        }
        inputs = []
        for name, text in texts.items():
            path = os.path.join(d, name)
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            inputs.append(path)
        out = os.path.join(d, "out")
        rc, log = gpt2_data(inputs + ["--out", out, "--doc_separator", "%", "--val_fraction", "0.2", "--seed", "3",
                                      "--threads", "2"])
        check(rc == 0, "gpt2-data on text files exits 0 (%d)\n%s" % (rc, log))
        expected = [enc.encode_ordinary(doc) for name in texts for doc in split_docs(texts[name], "%")]
        train = docs_of_stream(read_split(os.path.join(out, "train.h5")))
        val = docs_of_stream(read_split(os.path.join(out, "val.h5")))
        check(len(val) >= 1, "val split has documents")
        check_partition(expected, train, val, "text files")
        check("bytes/token" in log and "MB/s" in log, "summary printed")

        # ---- no val file when the fraction is 0; whole files as documents
        out0 = os.path.join(d, "out0")
        rc, log = gpt2_data(inputs + ["--out", out0, "--val_fraction", "0"])
        check(rc == 0, "gpt2-data --val_fraction 0 exits 0")
        check(not os.path.exists(os.path.join(out0, "val.h5")), "no val.h5 when --val_fraction 0")
        train = docs_of_stream(read_split(os.path.join(out0, "train.h5")))
        check(train == [enc.encode_ordinary(texts[n]) for n in texts], "whole files: tokens equal tiktoken's")

        # ---- the fortune directory: .dat indexes, symlinks skipped, % separated fortunes
        if os.path.isdir(FORTUNES_DIR):
            outf = os.path.join(d, "fortunes")
            rc, log = gpt2_data([FORTUNES_DIR, "--out", outf, "--doc_separator", "%"])
            check(rc == 0, "gpt2-data on %s exits 0 (%d)\n%s" % (FORTUNES_DIR, rc, log[-2000:]))
            expected = []
            for name in sorted(os.listdir(FORTUNES_DIR)):
                path = os.path.join(FORTUNES_DIR, name)
                if name.startswith(".") or name.endswith(".dat") or os.path.islink(path) or not os.path.isfile(path):
                    continue
                raw = open(path, "rb").read()
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if "\0" in text:
                    continue
                expected += [enc.encode_ordinary(doc) for doc in split_docs(text, "%")]
            train = docs_of_stream(read_split(os.path.join(outf, "train.h5")))
            val = docs_of_stream(read_split(os.path.join(outf, "val.h5")))
            check_partition(expected, train, val, "fortunes")
            check("skipped" in log and ".dat" in log, "fortune *.dat files reported as skipped")

        # ---- errors: exit 2 with a message naming the path or option
        missing = os.path.join(d, "no_such_file.txt")
        rc, log = gpt2_data([missing, "--out", os.path.join(d, "x")])
        check(rc == 2 and missing in log, "missing input: exit 2 naming it (%d: %s)" % (rc, log.strip()[-300:]))
        rc, log = gpt2_data(["--out", os.path.join(d, "x")])
        check(rc == 2 and "no INPUT" in log, "no input: exit 2 (%d)" % rc)
        rc, log = gpt2_data([inputs[0], "--out", os.path.join(d, "x"), "--val_fraction", "1.5"])
        check(rc == 2 and "--val_fraction" in log, "bad --val_fraction: exit 2 naming it (%d)" % rc)
        rc, log = gpt2_data([inputs[0], "--out", os.path.join(d, "x"), "--bogus"])
        check(rc == 2 and "bogus" in log, "unknown option: exit 2 naming it (%d)" % rc)
        rc, log = gpt2_data([inputs[0]])
        check(rc == 2 and "--out" in log, "missing --out: exit 2 (%d)" % rc)
        empty = os.path.join(d, "empty.txt")
        open(empty, "w").close()
        rc, log = gpt2_data([empty, "--out", os.path.join(d, "x")])
        check(rc == 2 and "no documents" in log, "empty input: exit 2 (%d)" % rc)
        latin1 = os.path.join(d, "latin1.txt")
        with open(latin1, "wb") as f:
            f.write(b"caf\xe9\n")
        rc, log = gpt2_data([latin1, "--out", os.path.join(d, "x")])
        check(rc == 2 and latin1 in log and "UTF-8" in log, "explicit non-UTF-8 file: exit 2 naming it (%d)" % rc)
        rc, log = gpt2_data([inputs[0], "--out", os.path.join(d, "x"), "--tokenizer_dir", os.path.join(d, "nope")])
        check(rc == 2 and "encoder.json" in log, "bad --tokenizer_dir: exit 2 naming the file (%d)" % rc)

    finish()


if __name__ == "__main__":
    main()
