"""launch/plot.sh on a synthetic metrics.jsonl: a PNG of the size the script sets, the columns it
hands gnuplot equal to the input (nulls and a half-written last line included), no temp files
left; a missing file, an empty one and one without loss lines exit 1 naming the file."""
import json
import math
import os
import re
import struct
import subprocess
import tempfile
import unittest

SOURCE = os.environ.get("GPT2_SOURCE_DIR", ".")
SCRIPT = os.path.join(SOURCE, "launch", "plot.sh")


def train_line(i):
    step = 10 * i
    return {"step": step, "loss": 2.0 + 5.0 * math.exp(-step / 150), "lr": 3e-4 * min(1.0, (step + 10) / 100),
            "grad_norm": None if i == 20 else 1.0 + 0.5 * math.sin(step / 30), "tokens_per_sec": 12345.6 + i,
            "ms_per_step": 88.1, "mfu": 0.31, "peak_mem_gib": 1.2, "data_wait_frac": 0.0001, "loss_scale": 1,
            "tokens": 123 * step}


def read_tsv(path):
    """The kept TSV as two blocks of float rows (NaN for null); '#' header lines dropped."""
    with open(path) as f:
        text = f.read()
    blocks = [[]]
    for line in text.split("\n")[:-1]:
        if not line:
            if blocks[-1]:
                blocks.append([])
        elif not line.startswith("#"):
            blocks[-1].append([float(x) for x in line.split("\t")])
    return blocks


def same(a, b):
    return (a is None and math.isnan(b)) or (a is not None and math.isclose(a, b, rel_tol=1e-12))


class Plot(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.scratch = os.path.join(self.tmp.name, "scratch")  # the script's TMPDIR: must end empty
        os.mkdir(self.scratch)

    def tearDown(self):
        self.tmp.cleanup()

    def run_plot(self, *args, env=None):
        env = dict(os.environ, TMPDIR=self.scratch, **(env or {}))
        p = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(os.listdir(self.scratch), [], "temp files left behind")
        return p

    def write(self, name, lines, tail=""):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines) + tail)
        return path

    def test_plots_every_value(self):
        train = [train_line(i) for i in range(50)]
        val = [{"step": 100 * k + 90, "val_loss": 2.1 + 5.0 * math.exp(-(100 * k + 90) / 150)} for k in range(5)]
        lines = []
        for t in train:
            lines.append(t)
            lines += [v for v in val if v["step"] == t["step"]]
        # A run killed mid-write leaves half a line: skipped, not fatal.
        metrics = self.write("metrics.jsonl", lines, tail='{"step": 500, "loss": 2.')
        tsv = os.path.join(self.tmp.name, "kept.tsv")
        p = self.run_plot(metrics, env={"GPT2_PLOT_KEEP_TSV": tsv})
        self.assertEqual(p.returncode, 0, p.stderr)

        png_path = os.path.join(self.tmp.name, "metrics.png")  # the default: .jsonl -> .png
        with open(png_path, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(png[12:16], b"IHDR")
        width, height = struct.unpack(">II", png[16:24])
        with open(SCRIPT) as f:
            script = f.read()
        self.assertEqual(width, int(re.search(r"^width=(\d+)$", script, re.M).group(1)))
        self.assertEqual(height, int(re.search(r"^height=(\d+)$", script, re.M).group(1)))

        rows, val_rows = read_tsv(tsv)
        self.assertEqual(len(rows), 50)
        for t, row in zip(train, rows):
            want = [t["step"], t["loss"], t["lr"], t["tokens_per_sec"], t["grad_norm"]]
            self.assertTrue(all(same(a, b) for a, b in zip(want, row)), f"{want} vs {row}")
        self.assertTrue(math.isnan(rows[20][4]), "the null grad_norm is a gap")
        self.assertEqual([[v["step"], v["val_loss"]] for v in val], val_rows)

    def test_explicit_output(self):
        metrics = self.write("m.jsonl", [train_line(i) for i in range(3)])
        out = os.path.join(self.tmp.name, "sub.png")
        p = self.run_plot(metrics, out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.isfile(out))

    def test_bad_inputs_exit_1_naming_the_file(self):
        missing = os.path.join(self.tmp.name, "missing.jsonl")
        empty = self.write("empty.jsonl", [])
        no_loss = self.write("val_only.jsonl", [{"step": 10, "val_loss": 3.0}, {"step": 20, "val_loss": None}])
        for path, why in [(missing, "no such file"), (empty, "empty"), (no_loss, "no training lines")]:
            with self.subTest(os.path.basename(path)):
                p = self.run_plot(path)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(path, p.stderr)
                self.assertIn(why, p.stderr)
                self.assertFalse(os.path.exists(path[: -len(".jsonl")] + ".png"))

    def test_usage(self):
        p = self.run_plot()
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage:", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
