"""gpt2-ckpt export-onnx, checked by the onnx package and ONNX Runtime (drives build/bin, build/tests).

Checks:
- both graphs pass onnx.checker's full check (shape inference included), at opset 17, with named
  (dynamic) batch and sequence axes, in fp32 and fp16, and share one weights file;
- ONNX Runtime's fp32 logits on the golden texts are within 1e-4 (max |diff| / max |ref|, the
  issue's bar) of our C++ model's on the same ids (hf_logits_probe: the forward gpt2-generate runs).
  Both are fp32 evaluations of the same function in other orders of summation: their difference is
  rounding, about n u32 = 2e-5 relative for the longest sums here (n = 256 terms of C = 64 and
  4C), so 1e-4 leaves room while a wrong op (a missing bias, a mask off by one) moves logits by
  whole units;
- 32 greedy tokens through model_with_past.onnx (the prompt with an empty past, then one token a
  call) equal gpt2-generate's --temperature 0 ids for 3 prompts;
- a Hugging Face directory exports the same way: ORT's logits within 1e-4 of transformers';
- the fp16 graphs run: logits within 20 u16 = 20 * 2^-11 (~1e-2) of fp32's (each of the ~20
  operations a layer rounds its result to fp16 once; 2 layers);
- bad input exits 2 naming the option or path, and writes nothing.
"""
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from test_generate import ids_of, random_hf_model

BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
TEST_BIN_DIR = os.environ.get("GPT2_TEST_BIN_DIR", "build/tests")
CKPT = os.path.join(BIN_DIR, "gpt2-ckpt")
GENERATE = os.path.join(BIN_DIR, "gpt2-generate")
PROBE = os.path.join(TEST_BIN_DIR, "hf_logits_probe")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
REL_TOL = 1e-4


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True, errors="replace", timeout=300, cwd=SRC)
    return p.returncode, p.stdout, p.stderr


def golden_ids():
    golden = os.path.join(SRC, "tests", "data", "golden")
    out = []
    for name in sorted(os.listdir(golden)):
        if name.endswith(".gpt2.json"):
            with open(os.path.join(golden, name)) as f:
                out.append(json.load(f))
    return out


def rel(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)).max() / np.abs(ref).max())


class OnnxExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as e:
            raise unittest.SkipTest(f"{e} (launch/install-deps.sh installs onnx and onnxruntime)")
        cls.tmp = tempfile.TemporaryDirectory()
        t = cls.tmp.name
        cls.hf = os.path.join(t, "hf")
        cls.hf_model = random_hf_model(n_positions=128)
        cls.hf_model.save_pretrained(cls.hf)
        cls.model = os.path.join(t, "model.h5")  # our model file, as gpt2-ckpt consolidate writes one
        rc, _, err = run(CKPT, "import-hf", cls.hf, "--out", cls.model)
        assert rc == 0, err
        cls.out = {}
        for name, src, dtype in [("fp32", cls.model, "fp32"), ("fp16", cls.model, "fp16"), ("hf", cls.hf, "fp32")]:
            cls.out[name] = os.path.join(t, "onnx_" + name)
            rc, out, err = run(CKPT, "export-onnx", src, "--out", cls.out[name], "--dtype", dtype)
            assert rc == 0, out + err

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def session(self, name, graph="model.onnx"):
        import onnxruntime as ort
        return ort.InferenceSession(os.path.join(self.out[name], graph), providers=["CPUExecutionProvider"])

    def our_logits(self, ids):
        inp, out = os.path.join(self.tmp.name, "in.safetensors"), os.path.join(self.tmp.name, "out.safetensors")
        idx = torch.tensor([ids])
        save_file({"idx": idx, "targets": idx.clone()}, inp)
        rc, log, err = run(PROBE, "logits", self.model, inp, out)
        self.assertEqual(rc, 0, log + err)
        return load_file(out)["logits"].double().numpy()

    def test_graphs_pass_the_full_checker_with_dynamic_axes(self):
        import onnx
        for name in ("fp32", "fp16"):
            files = sorted(os.listdir(self.out[name]))
            self.assertEqual(files, ["LICENSE", "encoder.json", "model.onnx", "model.onnx.data", "model_with_past.onnx",
                                     "vocab.bpe"])
            for graph in ("model.onnx", "model_with_past.onnx"):
                path = os.path.join(self.out[name], graph)
                onnx.checker.check_model(path, full_check=True)
                m = onnx.load(path, load_external_data=False)
                self.assertEqual([(o.domain, o.version) for o in m.opset_import], [("", 17)])
                ids = m.graph.input[0]
                self.assertEqual(ids.name, "input_ids")
                self.assertEqual([d.dim_param for d in ids.type.tensor_type.shape.dim], ["batch", "sequence"])
                external = {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"}
                self.assertEqual(external, {"model.onnx.data"})
                # The head is tied: wte is one initializer, read by the Gather and the Gemm.
                wte = [t for t in m.graph.initializer if t.name == "transformer.wte.weight"]
                self.assertEqual(len(wte), 1)
                readers = [n.op_type for n in m.graph.node if "transformer.wte.weight" in n.input]
                self.assertEqual(sorted(readers), ["Gather", "Gemm"])

    def test_logits_on_the_golden_texts_equal_ours(self):
        s = self.session("fp32")
        for ids in golden_ids():
            ids = ids[:128]  # the model's context
            got = s.run(["logits"], {"input_ids": np.array([ids], np.int64)})[0]
            ref = self.our_logits(ids)
            self.assertEqual(got.shape, ref.shape)
            err = rel(got, ref)
            print(f"[ measured ] golden text of {len(ids)} ids: ONNX Runtime vs ours max rel {err:.2e}")
            self.assertLessEqual(err, REL_TOL)

    def greedy_with_past(self, name, prompt, n):
        s = self.session(name, "model_with_past.onnx")
        inputs = [i.name for i in s.get_inputs()]
        outputs = [o.name for o in s.get_outputs()]
        cfg = self.hf_model.config
        dtype = np.float16 if name == "fp16" else np.float32
        past = {k: np.zeros((1, cfg.n_head, 0, cfg.n_embd // cfg.n_head), dtype) for k in inputs if k != "input_ids"}
        ids, step = list(prompt), list(prompt)
        for _ in range(n):
            res = dict(zip(outputs, s.run(None, {"input_ids": np.array([step], np.int64), **past})))
            self.assertEqual(res["logits"].shape[1], len(step))
            step = [int(res["logits"][0, -1].argmax())]
            ids += step
            past = {k: res[k.replace("past_key_values", "present")] for k in past}
        return ids

    def test_greedy_through_the_past_graph_equals_gpt2_generate(self):
        prompts = [[464], [464, 2068, 7586, 21831], [15496, 11, 616, 1438, 318, 1757, 290, 314, 588]]
        n = 32
        args = ["--ids", "--temperature", "0", "--max_new_tokens", str(n), "--ignore_eot", "--device", "cpu",
                "--dtype", "fp32"]
        for p in prompts:
            args += ["--prompt", " ".join(map(str, p))]
        rc, out, err = run(GENERATE, self.model, *args)
        self.assertEqual(rc, 0, err)
        ours = ids_of(out)
        self.assertEqual(len(ours), 3, out)
        for p, want in zip(prompts, ours):
            self.assertEqual(self.greedy_with_past("fp32", p, n), want, f"prompt {p}")
        self.assertGreater(len(set(ours[2][9:])), 3, "greedy output too repetitive to tell models apart")

    def test_a_hugging_face_directory_exports_the_same_way(self):
        ids = golden_ids()[0][:128]
        got = self.session("hf").run(["logits"], {"input_ids": np.array([ids, ids[::-1]], np.int64)})[0]
        with torch.no_grad():
            ref = self.hf_model(torch.tensor([ids, ids[::-1]])).logits.double().numpy()
        err = rel(got, ref)
        print(f"[ measured ] Hugging Face directory, batch of 2: ONNX Runtime vs transformers max rel {err:.2e}")
        self.assertLessEqual(err, REL_TOL)
        # The same weights through our model file give the same graphs' outputs.
        again = self.session("fp32").run(["logits"], {"input_ids": np.array([ids], np.int64)})[0]
        self.assertLessEqual(rel(again, got[:1]), REL_TOL)

    def test_fp16_graphs_run_within_fp16_rounding(self):
        ids = golden_ids()[1][:64]
        x = np.array([ids], np.int64)
        got = self.session("fp16").run(["logits"], {"input_ids": x})[0]
        ref = self.session("fp32").run(["logits"], {"input_ids": x})[0]
        err = rel(got, ref)
        print(f"[ measured ] fp16 graph vs fp32 graph max rel {err:.2e}")
        self.assertLessEqual(err, 20 * 2.0 ** -11)
        prompt = ids[:4]
        self.assertEqual(len(self.greedy_with_past("fp16", prompt, 4)), 8)

    def test_bad_input_is_named_and_writes_nothing(self):
        bad = os.path.join(self.tmp.name, "bad")
        cases = [
            ((self.model, "--out", bad, "--dtype", "bf16"), "--dtype"),
            ((self.model, "--out", bad, "--tokenizer_dir", os.path.join(self.tmp.name, "none")), "tokenizer directory"),
            ((os.path.join(self.tmp.name, "missing.h5"), "--out", bad), "missing.h5"),
            ((self.model,), "--out"),
        ]
        for args, named in cases:
            rc, out, err = run(CKPT, "export-onnx", *args)
            self.assertEqual(rc, 2, out + err)
            self.assertIn(named, err)
            self.assertFalse(os.path.exists(bad), args)
        rc, _, err = run(CKPT, "inspect", self.model, "--dtype", "fp16")
        self.assertEqual(rc, 2)
        self.assertIn("--dtype is an option of export-onnx only", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
