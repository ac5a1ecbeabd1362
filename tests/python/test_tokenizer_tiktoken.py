"""Our C++ GPT-2 tokenizer (tests/data/tokenize_cli) against tiktoken built from the repo's own vocab
files, on the golden files, every fortune file, and random Unicode text. Must be exactly equal.
Run by CTest (env GPT2_SOURCE_DIR, GPT2_TEST_BIN_DIR); test_token_file_h5py.py imports its helpers."""
import json
import os
import subprocess
import sys

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def source_dir():
    return os.environ.get("GPT2_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def tokenizer_dir():
    return os.path.join(source_dir(), "data", "tokenizer", "gpt2")


def test_bin_dir():
    return os.environ.get("GPT2_TEST_BIN_DIR", os.path.join(source_dir(), "build", "tests"))


def bin_dir():
    return os.environ.get("GPT2_BIN_DIR", os.path.join(source_dir(), "build", "bin"))


def byte_decoder():
    """GPT-2's printable-unicode character -> byte map (the inverse of bytes_to_unicode)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
                 list(range(ord("\xae"), ord("\xff") + 1)))
    chars = printable[:]
    shifted = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def load_local_tiktoken(directory=None):
    """A tiktoken Encoding equal to tiktoken's "gpt2", built from encoder.json and vocab.bpe."""
    import tiktoken

    directory = directory or tokenizer_dir()
    dec = byte_decoder()
    to_bytes = lambda s: bytes(dec[ch] for ch in s)
    with open(os.path.join(directory, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(directory, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:-1]]
    # Ranks as BPE defines them: the 256 bytes, then each merge in file order. They must be the
    # encoder's ids (tiktoken uses the rank as the id).
    ranks = {to_bytes(k): v for k, v in encoder.items() if k != EOT}
    for i, (a, b) in enumerate(merges):
        assert ranks[to_bytes(a) + to_bytes(b)] == 256 + i, (a, b)
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: encoder[EOT]})


# ---------------------------------------------------------------------------------------- texts

FORTUNES_DIR = "/usr/share/games/fortunes"
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
               "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
NOT_WHITE_SPACE = "\x1c\x1d\x1e\x1f\u200b\u180e\ufeff"  # isspace() or look-alikes, but not White_Space


def golden_texts():
    golden = os.path.join(source_dir(), "tests", "data", "golden")
    out = []
    for name in sorted(os.listdir(golden)):
        if name.endswith(".txt"):
            with open(os.path.join(golden, name), encoding="utf-8") as f:
                out.append((name, f.read()))
    return out


def fortune_texts():
    """Every fortune text file as one text (the *.dat indexes and *.u8 symlinks left out)."""
    if not os.path.isdir(FORTUNES_DIR):
        print("note: %s not found, fortunes not compared" % FORTUNES_DIR)
        return []
    out = []
    for name in sorted(os.listdir(FORTUNES_DIR)):
        path = os.path.join(FORTUNES_DIR, name)
        if name.endswith(".dat") or os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                out.append((name, f.read()))
        except UnicodeDecodeError:
            print("note: %s is not UTF-8, skipped" % path)
    return out


def char_pools():
    import unicodedata

    pools = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        cat = unicodedata.category(chr(cp))
        if cat in ("Cn", "Cs", "Co"):  # unassigned in this Python's Unicode: tables may differ
            continue
        pools.setdefault(cat, []).append(chr(cp))
    ranges = {
        "latin": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\xe9\xe8\xfc\xf6\xe4\xdf\xe7\xf1\xf8\xe5",
        "greek": "".join(map(chr, range(0x3b1, 0x3ca))) + "\u0391\u0392\u03a9",
        "cyrillic": "".join(map(chr, range(0x430, 0x450))),
        "arabic": "".join(map(chr, range(0x627, 0x64b))),
        "hebrew": "".join(map(chr, range(0x5d0, 0x5eb))),
        "devanagari": "".join(map(chr, range(0x905, 0x939))) + "\u093f\u0940\u094d",
        "thai": "".join(map(chr, range(0xe01, 0xe2f))) + "\u0e31\u0e34",
        "cjk": "".join(map(chr, range(0x4e00, 0x4e80))) + "\u65e5\u672c\u8a9e",
        "hangul": "".join(map(chr, range(0xac00, 0xac40))),
        "kana": "".join(map(chr, range(0x3041, 0x3097))) + "\u30a2\u30ab\u30fc",
        "emoji": "".join(map(chr, range(0x1f600, 0x1f650))) + "\U0001f680\U0001f525\u2764\ufe0f\u200d",
        "digits": "0123456789\u0660\u0661\u0662\u0966\u0967\uff10\uff11\u2160\u2161\u00bd\u00b2\u2460",
        "punct": "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\u2014\u2019\u201c\u201d\u00ab\u00bb\u2026\u00a7",
        "marks": "\u0301\u0308\u0327\u20dd\u0951\u093c",
    }
    return pools, ranges


def random_texts(rng, count):
    pools, ranges = char_pools()
    categories = sorted(pools)
    contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Ve", "'RE", "'D", "'x", "''",
                    "\u2019s", "'", "' s", "n't", "'ll've"]
    words = ["hello", "world", "The", "don", "it", "GPT", "tokenizer", "caf\xe9", "na\xefve", "\u65e5\u672c",
             "\u0645\u0631\u062d\u0628\u0627", "\u043f\u0440\u0438\u0432\u0435\u0442", "x", "I", "a"]

    def fragment():
        kind = rng.randrange(11)
        if kind == 0:
            s = ranges[rng.choice(sorted(ranges))]
            return "".join(rng.choice(s) for _ in range(rng.randint(1, 8)))
        if kind == 1:
            return "".join(rng.choice(WHITE_SPACE + " " * 10 + "\n" * 3) for _ in range(rng.randint(1, 6)))
        if kind == 2:
            return rng.choice(contractions)
        if kind == 3:
            return str(rng.randint(0, 10 ** rng.randint(1, 12)))
        if kind == 4:
            return rng.choice(words)
        if kind == 5:
            return rng.choice(" \t\r\n") + rng.choice(words)
        if kind == 6:
            cat = rng.choice(categories)
            return "".join(rng.choice(pools[cat]) for _ in range(rng.randint(1, 4)))
        if kind == 7:
            return rng.choice(NOT_WHITE_SPACE)
        if kind == 8:
            return rng.choice(["\r\n", "\r\n\r\n", " \n", "\n\n\n", "\t\t", "\u00a0\u00a0", "\u3000"])
        if kind == 9:
            return ranges["punct"][rng.randrange(len(ranges["punct"]))] * rng.randint(1, 5)
        return " " + rng.choice(words)

    texts = []
    for _ in range(count):
        texts.append("".join(fragment() for _ in range(rng.randint(0, 40))))
    # Long pieces: single pre-tokenizer pieces of hundreds to thousands of bytes (heap merge path).
    for n in (129, 200, 500, 1000, 3000):
        texts.append("".join(rng.choice(ranges["latin"][:26]) for _ in range(n)))
        texts.append(" " + "".join(rng.choice(ranges["cjk"]) for _ in range(n // 3)))
        texts.append(rng.choice(ranges["punct"][:20]) * n)
        texts.append("ab" * n)
        texts.append(" " * n + "x")
        texts.append("\n" * n)
        texts.append("".join(rng.choice(WHITE_SPACE) for _ in range(n)) + "end")
        texts.append(str(rng.randint(0, 9)) * n)
    texts += ["", " ", "'", "'s", "a'", " '", "\u00a0", "x\u0301", "\U0001f468\u200d\U0001f469\u200d\U0001f467"]
    return texts


def cpp_encode(texts, workdir):
    batch = os.path.join(workdir, "batch.json")
    with open(batch, "w", encoding="ascii") as f:
        json.dump(texts, f, ensure_ascii=True)  # \u escapes, astral code points as surrogate pairs
    cli = os.path.join(test_bin_dir(), "tokenize_cli")
    p = subprocess.run([cli, tokenizer_dir(), "--batch", batch], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("tokenize_cli failed (%d): %s" % (p.returncode, p.stderr))
    lines = p.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == len(texts) + 1, (len(lines), len(texts))
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def main():
    import random
    import tempfile

    enc = load_local_tiktoken()
    named = golden_texts() + fortune_texts()
    rng = random.Random(20260501)
    randoms = random_texts(rng, 6000)
    texts = [t for _, t in named] + randoms
    names = [n for n, _ in named] + ["random[%d]" % i for i in range(len(randoms))]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        ours = cpp_encode(texts, d)
        tokens = 0
        for name, text, got in zip(names, texts, ours):
            want = enc.encode_ordinary(text)
            tokens += len(want)
            if got != want:
                failures.append(name)
                if len(failures) <= 5:
                    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
                    print("FAIL %s: first difference at token %d: ours %s tiktoken %s; text %r" %
                          (name, i, got[max(0, i - 2):i + 4], want[max(0, i - 2):i + 4], text[:200]))

        # The golden ids themselves (made with "<|endoftext|>" as the special token).
        for name, text in golden_texts():
            with open(os.path.join(source_dir(), "tests", "data", "golden", name + ".gpt2.json")) as f:
                golden = json.load(f)
            if enc.encode(text, allowed_special="all") != golden:
                failures.append("golden " + name + " vs tiktoken")

        # Invalid UTF-8 is an error naming the file and byte offset, exit code 2.
        bad = os.path.join(d, "bad.txt")
        with open(bad, "wb") as f:
            f.write(b"valid start \xe6\x97 then junk")
        p = subprocess.run([os.path.join(test_bin_dir(), "tokenize_cli"), tokenizer_dir(), bad],
                           capture_output=True, text=True)
        if p.returncode != 2 or (bad + ": invalid UTF-8 at byte offset 12") not in p.stderr:
            failures.append("invalid UTF-8: rc %d, stderr %r" % (p.returncode, p.stderr))

    chars = sum(len(t) for t in texts)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    print("compared %d texts (%d named files, %d random), %d chars, %d bytes, %d tokens"
          % (len(texts), len(named), len(randoms), chars, nbytes, tokens))
    if failures:
        print("FAILED: %d mismatches: %s" % (len(failures), failures[:20]))
        sys.exit(1)
    print("all equal to tiktoken")


if __name__ == "__main__":
    main()
