"""Event files from our TensorBoardWriter (through tensorboard_probe) read by TensorBoard's own
EventAccumulator: tags, steps and float32 values exactly, NaN kept, steps out of order across tags
kept (the file_version event turns off TensorBoard's out-of-order purge), and a file cut in the
middle of its last record still gives every complete record before it."""
import json
import math
import os
import struct
import subprocess
import tempfile
import time
import unittest

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

PROBE = os.path.join(os.environ.get("GPT2_TEST_BIN_DIR", "build/tests"), "tensorboard_probe")
TRAIN = os.path.join(os.environ.get("GPT2_BIN_DIR", "build/bin"), "gpt2-train")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
SCALARS = ["loss=2.5@0", "loss=2.25@1", "lr=3e-4@0", "grad_norm=nan@1", "tokens_per_sec=12345.6@1"]


def f32(x):
    """x rounded to float32, the precision of Summary.Value.simple_value."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load(directory):
    acc = EventAccumulator(directory)
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def record_offsets(path):
    """Start offsets of the TFRecords in `path` (u64 length, u32 crc, data, u32 crc)."""
    with open(path, "rb") as f:
        data = f.read()
    offsets, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        offsets.append(pos)
        pos += 12 + length + 4
    assert pos == len(data), f"{path}: records do not end at the file's end ({pos} vs {len(data)})"
    return offsets


class TensorBoardReadsOurEvents(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(PROBE):
            self.skipTest(f"{PROBE} not built")
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = os.path.join(self.tmp.name, "tb")
        self.start = time.time()
        p = subprocess.run([PROBE, self.dir] + SCALARS, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.path = p.stdout.strip()
        self.assertIn("tfevents", os.path.basename(self.path))

    def tearDown(self):
        self.tmp.cleanup()

    def test_values_steps_tags(self):
        got = load(self.dir)
        self.assertEqual(sorted(got), ["grad_norm", "loss", "lr", "tokens_per_sec"])
        self.assertEqual([(s, v) for s, v, _ in got["loss"]], [(0, 2.5), (1, 2.25)])
        self.assertEqual([(s, v) for s, v, _ in got["lr"]], [(0, f32(3e-4))])
        self.assertEqual([(s, v) for s, v, _ in got["tokens_per_sec"]], [(1, f32(12345.6))])
        self.assertEqual([s for s, _, _ in got["grad_norm"]], [1])
        self.assertTrue(math.isnan(got["grad_norm"][0][1]))
        for tag, events in got.items():
            for _, _, wall in events:
                self.assertLessEqual(abs(wall - self.start), 60, tag)

    def test_truncated_last_record(self):
        offsets = record_offsets(self.path)
        # file_version, loss@0, loss@1, lr@0, then grad_norm + tokens_per_sec@1 in one Event.
        self.assertEqual(len(offsets), 5)
        size = os.path.getsize(self.path)
        with open(self.path, "r+b") as f:
            f.truncate(offsets[-1] + (size - offsets[-1]) // 2)
        got = load(self.dir)
        self.assertEqual(sorted(got), ["loss", "lr"])
        self.assertEqual([(s, v) for s, v, _ in got["loss"]], [(0, 2.5), (1, 2.25)])
        self.assertEqual([(s, v) for s, v, _ in got["lr"]], [(0, f32(3e-4))])


class TrainingRunWritesEvents(unittest.TestCase):
    """gpt2-train's log.tensorboard: every scalar of metrics.jsonl (the same run) is in the event
    file at the same step (to the 7 digits the JSON keeps); launch/plot.sh draws the same run."""

    def test_events_equal_metrics_jsonl(self):
        if not os.path.exists(TRAIN):
            self.skipTest(f"{TRAIN} not built")
        import numpy as np
        from checks import write_tokens
        with tempfile.TemporaryDirectory() as tmp:
            tokens = os.path.join(tmp, "tokens.h5")
            write_tokens(tokens, np.arange(20000) * 7 % 251)
            metrics, tb = os.path.join(tmp, "metrics.jsonl"), os.path.join(tmp, "tb")
            args = ["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=256",
                    "--model.block_size=32", f"--data.train={tokens}", f"--data.val={tokens}",
                    "--train.micro_batch=2", "--train.seq_len=16", "--train.batch_tokens=32", "--train.max_steps=12",
                    "--train.eval_every=5", "--train.eval_steps=2", "--train.sample_tokens=0", "--train.device=cpu",
                    "--log.every=2", f"--log.metrics={metrics}", f"--log.tensorboard={tb}", "--checkpoint.every=0"]
            p = subprocess.run([TRAIN] + args, capture_output=True, text=True, timeout=300, cwd=SRC)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertRegex(p.stderr, r"step 11/12 \| loss [0-9.]+ .*\| eta ")
            lines = [json.loads(line) for line in open(metrics)]
            got = load(tb)
            compared = 0
            for line in lines:
                for key, value in line.items():
                    if key in ("step", "tokens"):
                        continue
                    events = {s: v for s, v, _ in got[key]}
                    self.assertIn(line["step"], events, key)
                    if value is None:
                        self.assertFalse(math.isfinite(events[line["step"]]), key)
                    else:
                        # metrics.jsonl prints 7 significant digits, the event a float32.
                        self.assertLessEqual(abs(events[line["step"]] - value), 1e-6 * abs(value) + 1e-30,
                                             f"{key} at step {line['step']}: {events[line['step']]} vs {value}")
                    compared += 1
            self.assertEqual(sorted(s for s, _, _ in got["loss"]), [0, 2, 4, 6, 8, 10, 11])
            self.assertEqual(sorted(s for s, _, _ in got["val_loss"]), [0, 5, 10, 12])  # the last after the last update
            self.assertGreater(compared, 60)
            png = os.path.join(tmp, "curves.png")
            p = subprocess.run(["bash", os.path.join(SRC, "launch/plot.sh"), metrics, png], capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
