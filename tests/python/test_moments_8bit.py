"""Block-wise 8-bit quantization (optim/moments_8bit.h) against numpy: the maps are built here from
the words of Note [Dynamic map], by enumerating codes bit by bit (sign, zero run, one bit, fraction),
not by the C++ loop over decades; quantization is a vectorised nearest search (ties to the lower
value); both in fp32. The codes must match exactly, the absmax values and the decoded values bitwise.
Drives build/tests/moments_8bit_probe. Run by CTest."""
import os, subprocess, tempfile
import numpy as np
from checks import check, finish

PROBE = os.path.join(os.environ.get("GPT2_TEST_BIN_DIR", "build/tests"), "moments_8bit_probe")
BLOCK = 2048


def code_value(code, signed):
    """The value of an 8-bit code read from its high bit down (None: the signed map's spare code)."""
    bits = [(code >> (7 - i)) & 1 for i in range(8)]
    sign = 1.0
    if signed:
        sign = -1.0 if bits[0] else 1.0
        bits = bits[1:]
    if 1 not in bits:  # no one bit: zero (and, with a negative sign bit, the spare 1e-7)
        return 1e-7 if (signed and sign < 0) else 0.0
    e = bits.index(1)
    frac_bits = bits[e + 1:]
    j = int("".join(map(str, frac_bits)), 2) if frac_bits else 0
    f = len(frac_bits)
    return sign * (1.0 / 10.0 ** e) * (0.1 + 0.9 * (j + 1) / 2 ** f)


def dynamic_map(signed):
    values = sorted(code_value(c, signed) for c in range(256))
    return np.array(values, dtype=np.float64).astype(np.float32)


def quantize(m, x):
    """Nearest map entry of each fp32 value, ties to the lower index."""
    hi = np.clip(np.searchsorted(m, x, side="left"), 1, 255)
    lo = hi - 1
    below = x - m[lo]
    above = m[hi] - x
    codes = np.where(below <= above, lo, hi)
    codes = np.where(x <= m[0], 0, np.where(x > m[255], 255, codes))
    return codes.astype(np.uint8)


def blockwise(m, x):
    n = len(x)
    blocks = (n + BLOCK - 1) // BLOCK
    codes = np.empty(n, np.uint8)
    absmax = np.empty(blocks, np.float32)
    back = np.empty(n, np.float32)
    for b in range(blocks):
        xs = x[b * BLOCK:(b + 1) * BLOCK]
        a = np.float32(np.abs(xs).max())
        absmax[b] = a
        c = quantize(m, xs / (a if a > 0 else np.float32(1)))
        codes[b * BLOCK:(b + 1) * BLOCK] = c
        back[b * BLOCK:(b + 1) * BLOCK] = m[c] * a
    return codes, absmax, back


def main():
    rng = np.random.default_rng(0)
    n = 5 * BLOCK + 777  # a short last block
    # Moments of very different magnitudes by block, a block of zeros, exact map values and ties.
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 1, size=n // BLOCK + 1).repeat(BLOCK)[:n]).astype(np.float32)
    x[BLOCK:2 * BLOCK] = 0
    sm, um = dynamic_map(True), dynamic_map(False)
    x[2 * BLOCK] = 1.0  # the third block's absmax: its other values are multiples of it
    x[2 * BLOCK + 1:2 * BLOCK + 257] = sm
    x[2 * BLOCK + 257:2 * BLOCK + 300] = (sm[100:143] + sm[101:144]) / 2  # midpoints: ties go low
    sq = np.abs(x) ** 2  # a second moment: never negative
    sq = sq.astype(np.float32)

    check(len(set(sm.tolist())) == 256 and len(set(um.tolist())) == 256, "256 distinct values in each map")
    check(sm[0] == -1 and sm[-1] == 1 and 0 in sm and um[0] == 0 and um[-1] == 1, "ranges [-1, 1] and [0, 1]")

    with tempfile.TemporaryDirectory() as d:
        results = {}
        for name, data in (("first", x), ("second", sq)):
            data.tofile(f"{d}/{name}.in")
            p = subprocess.run([PROBE, f"{d}/{name}.in", f"{d}/{name}.out"], capture_output=True, text=True)
            check(p.returncode == 0, f"probe on the {name} moment ({p.stderr.strip() or 'ok'})")
            results[name] = np.fromfile(f"{d}/{name}.out", dtype=np.uint8) if p.returncode == 0 else None
    blocks = (n + BLOCK - 1) // BLOCK
    for name, data in (("first", x), ("second", sq)):
        raw = results[name]
        if raw is None:
            continue
        off = 0

        def take(count, dtype):
            nonlocal off
            size = count * np.dtype(dtype).itemsize
            out = raw[off:off + size].view(dtype)
            off += size
            return out

        got_sm, got_um = take(256, np.float32), take(256, np.float32)
        check(np.array_equal(got_sm, sm) and np.array_equal(got_um, um), f"{name}: the C++ maps equal numpy's bitwise")
        for signed, m in ((True, sm), (False, um)):
            codes, absmax, back = take(n, np.uint8), take(blocks, np.float32), take(n, np.float32)
            want_codes, want_absmax, want_back = blockwise(m, data)
            label = f"{name} moment, {'signed' if signed else 'unsigned'} map"
            if not signed and name == "first":
                continue  # negative values through the unsigned map: clamped to 0, not a case we use
            diff = np.flatnonzero(codes != want_codes)
            check(diff.size == 0, f"{label}: codes equal numpy's ({diff.size} differ"
                  + (f", first at {diff[0]}: {codes[diff[0]]} vs {want_codes[diff[0]]}" if diff.size else "") + ")")
            check(np.array_equal(absmax, want_absmax), f"{label}: absmax equal")
            check(np.array_equal(back, want_back), f"{label}: dequantized values equal bitwise")
            nz = absmax > 0
            if signed and name == "first":
                # Midpoints that fp32 holds exactly are ties: they take the lower entry.
                mids = (sm[100:143].astype(np.float64) + sm[101:144]) / 2
                exact = np.flatnonzero(mids.astype(np.float32).astype(np.float64) == mids)
                ties = codes[2 * BLOCK + 257:2 * BLOCK + 300][exact]
                check(exact.size > 10 and np.array_equal(ties, (100 + exact).astype(np.uint8)),
                      f"{label}: {exact.size} values halfway between two entries take the lower")
            # The rounding error of each value is at most half the gap to its neighbour entry.
            rel = np.abs(back - data) / np.repeat(np.where(nz, absmax, 1), BLOCK)[:n]
            gaps = np.diff(m).max()
            check(rel.max() <= gaps / 2 + 1e-7, f"{label}: worst error {rel.max():.3g} of absmax <= half the widest gap {gaps / 2:.3g}")
    finish()


if __name__ == "__main__":
    main()
