"""int8 weights for inference: gpt2-ckpt quantize, --quant int8 of gpt2-generate and gpt2-eval
(drives build/bin), against references written here with numpy and transformers.

Checks:
- the int8 model file (h5py): format_version 3, quant = int8, quant_group; for the tied wte (its
  padding rows too) and every block projection NAME.int8 equals round-half-even(W / s) and
  NAME.scale equals max|W| / 127 per row (or per group of 32 columns), computed here from the fp32
  weights, with no fp32 NAME left; the other parameters stay fp32 and equal;
- gpt2-eval's loss of the int8 file equals --quant int8 on the fp32 model (the same quantization),
  and both are within 1e-4 (relative) of transformers' loss with the dequantized weights put into
  the Hugging Face model: the same function of the same numbers in fp32, summed in other orders
  (the loss is a mean of log-softmaxes: its rounding is ~n u32 for n ~ 4C = 256 terms, 1.5e-5);
- a --group of n_embd is written as that group (not 0), and its file decodes as --quant_group 64;
- 24 greedy tokens of gpt2-generate --quant int8 (batch 1, so every projection takes the int8
  decode kernel) equal transformers' greedy decoding with the dequantized weights;
- bad input: --quant int4, a --quant_group that does not divide n_embd, an int8 file given to
  export-hf, and a format_version 2 int8 file (wte in fp32, from before) exit 2 naming the option,
  the file or the version.
"""
import os
import subprocess
import tempfile
import unittest

import re

import h5py
import numpy as np
import torch

from checks import write_tokens
from test_generate import EOT, hf_greedy, ids_of, random_hf_model

BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
CKPT = os.path.join(BIN_DIR, "gpt2-ckpt")
GENERATE = os.path.join(BIN_DIR, "gpt2-generate")
EVAL = os.path.join(BIN_DIR, "gpt2-eval")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
PROJECTIONS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
INT8 = PROJECTIONS + ("transformer.wte.weight",)  # our names; the HF head is tied to wte


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True, errors="replace", timeout=300, cwd=SRC)
    return p.returncode, p.stdout, p.stderr


def quantize_reference(w, group):
    """Note [int8 weights] in numpy: w (N, K) fp32 in our (out, in) layout -> q int8, scale fp32."""
    n, k = w.shape
    g = k if group == 0 else group
    blocks = w.reshape(n, k // g, g)
    scale = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    scale[scale == 0] = 1
    q = np.clip(np.round(blocks / scale[:, :, None]), -127, 127).astype(np.int8)  # numpy rounds half to even
    return q.reshape(n, k), scale


class Int8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        t = cls.tmp.name
        cls.hf = os.path.join(t, "hf")
        cls.model = random_hf_model(n_positions=128)
        cls.model.save_pretrained(cls.hf)
        cls.fp32 = os.path.join(t, "model.h5")
        rc, _, err = run(CKPT, "import-hf", cls.hf, "--out", cls.fp32)
        assert rc == 0, err
        cls.int8 = {}
        for group in (0, 32):
            cls.int8[group] = os.path.join(t, f"int8_g{group}.h5")
            args = [CKPT, "quantize", cls.fp32, "--out", cls.int8[group]] + (["--group", str(group)] if group else [])
            rc, out, err = run(*args)
            assert rc == 0, out + err

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def dequantized_hf_model(self, group):
        """The Hugging Face model with wte (so the tied head) and every block projection replaced by its
        int8 value (Conv1D: (in, out); wte without our padding rows)."""
        m = random_hf_model(n_positions=128)
        with h5py.File(self.fp32) as f, torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith(INT8):
                    q, s = quantize_reference(f[name][()], group)
                    w = (q.astype(np.float32).reshape(q.shape[0], s.shape[1], -1) * s[:, :, None]).reshape(q.shape)
                    p.copy_(torch.from_numpy(w[:p.shape[0]].copy() if name.endswith("wte.weight") else w.T.copy()))
        return m.eval()

    def test_the_file_holds_the_schemes_int8_weights(self):
        for group, path in self.int8.items():
            with h5py.File(self.fp32) as ref, h5py.File(path) as f:
                self.assertEqual(f.attrs["format_version"], 3)
                self.assertEqual(f.attrs["quant"], "int8")
                self.assertEqual(f.attrs["quant_group"], group)
                quantized = 0
                for name in ref:
                    if name.endswith(INT8):
                        self.assertNotIn(name, f)
                        q, s = quantize_reference(ref[name][()], group)
                        self.assertEqual(f[name + ".int8"].dtype, np.int8)
                        np.testing.assert_array_equal(f[name + ".int8"][()], q, err_msg=name)
                        np.testing.assert_array_equal(f[name + ".scale"][()], s, err_msg=name)
                        quantized += 1
                    else:
                        np.testing.assert_array_equal(f[name][()], ref[name][()], err_msg=name)
                self.assertEqual(quantized, 4 * 2 + 1)

    def test_eval_loss_is_the_dequantized_models(self):
        ids = np.random.RandomState(1).randint(0, 50257, size=4 * 64 + 1)
        tokens = os.path.join(self.tmp.name, "tokens.h5")
        write_tokens(tokens, ids, vocab=50257, eot=EOT)
        losses = {}
        for name, args in [("file", [self.int8[0]]), ("flag", [self.fp32, "--quant", "int8"]),
                           ("group", [self.int8[32]])]:
            rc, out, err = run(EVAL, *args, "--data", tokens, "--seq_len", "64", "--windows", "4", "--device", "cpu")
            self.assertEqual(rc, 0, out + err)
            losses[name] = float(re.search(r"^loss ([\d.]+) \|", out, re.M)[1])
        self.assertEqual(losses["file"], losses["flag"])
        # gpt2-eval's windows: seq_len + 1 tokens at multiples of seq_len.
        x = torch.from_numpy(np.stack([ids[64 * i:64 * i + 65] for i in range(4)]).astype(np.int64))
        for name, group in (("file", 0), ("group", 32)):
            with torch.no_grad():
                logits = self.dequantized_hf_model(group)(x[:, :-1]).logits.double()
                want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1)).item()
            print(f"[ measured ] int8 (group {group}) eval loss {losses[name]:.6f}, transformers dequantized {want:.6f}")
            self.assertLessEqual(abs(losses[name] - want) / want, 1e-4)

    def test_a_group_of_n_embd_is_kept_as_that_group(self):
        # n_embd = 64: wte's and c_attn's rows get one scale, mlp.c_proj's (K = 256) four; the file
        # must say 64, not 0 (one scale a row), or reading it expects one scale for mlp.c_proj.
        path = os.path.join(self.tmp.name, "int8_g64.h5")
        rc, out, err = run(CKPT, "quantize", self.fp32, "--out", path, "--group", "64")
        self.assertEqual(rc, 0, out + err)
        with h5py.File(path) as f:
            self.assertEqual(f.attrs["quant_group"], 64)
            self.assertEqual(f["transformer.h.0.mlp.c_proj.weight.scale"].shape, (64, 4))
        prompt = "15496 11 616 1438 318"
        outs = []
        for args in ([path], [self.fp32, "--quant", "int8", "--quant_group", "64"]):
            rc, out, err = run(GENERATE, *args, "--ids", "--temperature", "0", "--max_new_tokens", "8", "--ignore_eot",
                               "--device", "cpu", "--prompt", prompt)
            self.assertEqual(rc, 0, err)
            outs.append(ids_of(out)[0])
        self.assertEqual(outs[0], outs[1])

    def test_greedy_decoding_is_the_dequantized_models(self):
        prompt = [15496, 11, 616, 1438, 318]
        rc, out, err = run(GENERATE, self.fp32, "--quant", "int8", "--ids", "--temperature", "0", "--max_new_tokens", "24",
                           "--ignore_eot", "--device", "cpu", "--prompt", " ".join(map(str, prompt)))
        self.assertEqual(rc, 0, err)
        got = ids_of(out)[0]
        self.assertEqual(got, hf_greedy(self.dequantized_hf_model(0), prompt, 24))
        rc, out2, err = run(GENERATE, self.int8[0], "--ids", "--temperature", "0", "--max_new_tokens", "24",
                            "--ignore_eot", "--device", "cpu", "--prompt", " ".join(map(str, prompt)))
        self.assertEqual(rc, 0, err)
        self.assertEqual(ids_of(out2)[0], got)

    def test_bad_input_is_named(self):
        old = os.path.join(self.tmp.name, "int8_v2.h5")  # a file as format_version 2 wrote it: fp32 wte
        with h5py.File(self.int8[0]) as f, h5py.File(self.fp32) as ref, h5py.File(old, "w") as g:
            for key, value in f.attrs.items():
                g.attrs[key] = value
            g.attrs["format_version"] = 2
            for name in f:
                if not name.startswith("transformer.wte.weight"):
                    g.create_dataset(name, data=f[name][()])
            g.create_dataset("transformer.wte.weight", data=ref["transformer.wte.weight"][()])
        for args, named in [
            ((GENERATE, old, "--ids", "--prompt", "1"), "format_version 2"),
            ((GENERATE, self.fp32, "--quant", "int4"), "--quant"),
            ((GENERATE, self.fp32, "--quant", "int8", "--quant_group", "48"), "--quant_group"),
            ((CKPT, "quantize", self.fp32, "--out", os.path.join(self.tmp.name, "x.h5"), "--group", "48"), "--group"),
            ((CKPT, "export-hf", self.int8[0], "--out", os.path.join(self.tmp.name, "hf_out")), "int8"),
        ]:
            rc, out, err = run(*args)
            self.assertEqual(rc, 2, out + err)
            self.assertIn(named, err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
