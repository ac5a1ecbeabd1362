"""gpt2-generate against Hugging Face transformers' generate on the same weights (drives build/bin).

Checks: greedy tokens of a ragged batch (left padding inside our KV cache) equal HF's greedy
generate run prompt by prompt; --no_kv_cache (full recomputation) gives the same tokens; text mode
prints exactly what tiktoken decodes from the ids; sampling is a function of the seed; bad input
exits 2 naming the option or file. GPT2_TEST_DEVICE=cuda runs both on the GPU and prints tokens/s
for a batch-1 greedy run of each (the GPU machine's comparison); fp32 either way.
"""
import os
import re
import subprocess
import tempfile
import time
import unittest

import torch

from test_hf_parity import small_hf_model
from test_tokenizer_tiktoken import load_local_tiktoken  # tiktoken's gpt2 from the repo's vocab files

BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
GENERATE = os.path.join(BIN_DIR, "gpt2-generate")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
DEVICE = os.environ.get("GPT2_TEST_DEVICE", "cpu")
EOT = 50256


def random_hf_model(seed=0, **sizes):
    return small_hf_model(seed, sharpen=10.0, **sizes)


def generate(*args, timeout=300):
    p = subprocess.run([GENERATE, *args], capture_output=True, text=True, errors="replace", timeout=timeout, cwd=SRC)
    return p.returncode, p.stdout, p.stderr


def ids_of(stdout):
    """The id lists of a run with --ids: one line (streamed), or one per '=== sample i ===' block."""
    blocks = re.split(r"=== sample \d+ ===\n", stdout)
    return [[int(t) for t in b.split()] for b in blocks if b.strip()]


def hf_greedy(model, prompt, n):
    with torch.no_grad():
        ids = torch.tensor([prompt], device=DEVICE)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=EOT, eos_token_id=None)
    return out[0].tolist()


class Generate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(GENERATE):
            raise unittest.SkipTest(f"{GENERATE} not built")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "hf")
        cls.model = random_hf_model().to(DEVICE)
        cls.model.save_pretrained(cls.dir)
        cls.dev = ["--device", DEVICE, "--dtype", "fp32"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_ragged_batch_greedy_equals_hf_generate(self):
        prompts = [[464], [464, 2068, 7586, 21831], [15496, 11, 616, 1438, 318, 1757, 290, 314, 588]]
        n = 30
        args = ["--ids", "--temperature", "0", "--max_new_tokens", str(n), "--ignore_eot", *self.dev]
        for p in prompts:
            args += ["--prompt", " ".join(map(str, p))]
        rc, out, err = generate(self.dir, *args)
        self.assertEqual(rc, 0, err)
        ours = ids_of(out)
        self.assertEqual(len(ours), 3, out)
        for p, got in zip(prompts, ours):
            self.assertEqual(got, hf_greedy(self.model, p, n), f"prompt {p}")
        rc, out2, err = generate(self.dir, *args, "--no_kv_cache")
        self.assertEqual(rc, 0, err)
        self.assertEqual(ids_of(out2), ours)
        self.assertGreater(len(set(ours[2][9:])), 3, "greedy output too repetitive to tell models apart")

    def test_text_mode_prints_what_tiktoken_decodes(self):
        enc = load_local_tiktoken()
        prompt = "The quick brown fox"
        common = ["--temperature", "0", "--max_new_tokens", "16", "--ignore_eot", *self.dev]
        rc, text, err = generate(self.dir, "--prompt", prompt, *common)
        self.assertEqual(rc, 0, err)
        rc, ids_out, err2 = generate(self.dir, "--ids", "--prompt", " ".join(map(str, enc.encode(prompt))), *common)
        self.assertEqual(rc, 0, err2)
        ids = ids_of(ids_out)[0]
        self.assertEqual(ids[:4], enc.encode(prompt))
        self.assertEqual(text, enc.decode(ids, errors="replace") + "\n")
        self.assertRegex(err, r"generated 16 tokens for 1 prompt\(s\) in [0-9.]+ s: [0-9.]+ tokens/s")

    def test_sampling_depends_on_the_seed_only(self):
        args = ["--ids", "--prompt", "464 2068", "--max_new_tokens", "20", "--temperature", "1.0",
                "--top_k", "50", "--top_p", "0.95", "--ignore_eot", *self.dev]
        a = generate(self.dir, *args, "--seed", "1")
        b = generate(self.dir, *args, "--seed", "1")
        c = generate(self.dir, *args, "--seed", "2")
        self.assertEqual(a[0], 0, a[2])
        self.assertEqual(a[1], b[1])
        self.assertNotEqual(a[1], c[1])
        self.assertEqual(len(ids_of(a[1])[0]), 22)

    def test_text_stops_before_endoftext(self):
        # A model whose every next token is <|endoftext|> (ln_f outputs its bias, which only the
        # EOT row of the tied head lines up with): --ids shows the stop token, text leaves it out.
        d = os.path.join(self.tmp.name, "eot")
        m = random_hf_model(seed=3)
        with torch.no_grad():
            v = torch.randn(m.config.n_embd)
            m.transformer.ln_f.weight.zero_()
            m.transformer.ln_f.bias.copy_(v)
            m.transformer.wte.weight[EOT].copy_(10 * v)
        m.save_pretrained(d)
        rc, ids_out, err = generate(d, "--ids", "--prompt", "464", "--max_new_tokens", "8", *self.dev)
        self.assertEqual(rc, 0, err)
        self.assertEqual(ids_of(ids_out), [[464, EOT]])
        rc, text, err = generate(d, "--prompt", "The", "--prompt", "A", "--max_new_tokens", "8", *self.dev)
        self.assertEqual(rc, 0, err)
        self.assertEqual(text, "=== sample 0 ===\nThe\n=== sample 1 ===\nA\n")
        rc, text, err = generate(d, "--prompt", "The", "--max_new_tokens", "8", *self.dev)
        self.assertEqual((rc, text), (0, "The\n"), err)
        self.assertIn("generated 1 tokens", err)

    def test_prompt_file_batch_and_unconditional(self):
        pf = os.path.join(self.tmp.name, "prompts.txt")
        with open(pf, "w") as f:
            f.write("Hello\n\nOnce upon a time\\nthere\n")
        rc, out, err = generate(self.dir, "--prompt_file", pf, "--max_new_tokens", "5", *self.dev)
        self.assertEqual(rc, 0, err)
        self.assertIn("=== sample 1 ===\nOnce upon a time\nthere", out)
        rc, out, err = generate(self.dir, "--max_new_tokens", "5", "--ids", *self.dev)
        self.assertEqual(rc, 0, err)
        self.assertEqual(ids_of(out)[0][0], EOT)

    def test_help_shows_defaults_as_written(self):
        rc, out, _ = generate("--help")
        self.assertEqual(rc, 0)
        self.assertIn("--temperature arg (=0.8)", out)  # not 0.80000000000000004
        self.assertIn("--top_p arg (=1)", out)
        self.assertNotIn("0000000", out)

    def test_bad_input_is_named(self):
        missing = os.path.join(self.tmp.name, "nope")
        cases = [
            ([missing], missing),
            ([self.dir, "--top_p", "0"], "top_p"),
            ([self.dir, "--temperature", "-1"], "temperature"),
            ([self.dir, "--ids", "--prompt", "5 x"], "'x' is not a token id"),
            ([self.dir, "--ids", "--prompt", "50257"], "'50257' is not a token id"),
            ([self.dir, "--prompt_file", missing], missing),
            ([self.dir, "--device", "tpu"], "--device = tpu"),
            ([self.dir, "--bogus"], "bogus"),
            ([], "no MODEL"),
        ]
        for args, needle in cases:
            rc, out, err = generate(*args)
            self.assertEqual(rc, 2, f"{args}: rc {rc}\n{err}")
            self.assertIn(needle, err, args)
            self.assertEqual(out, "", f"{args}: nothing printed before the error")  # the prompt was, for -1

    @unittest.skipUnless(DEVICE == "cuda", "the speed comparison runs on the GPU machine")
    def test_speed_against_transformers_generate(self):
        # gpt2-124m shape (random weights), batch 1, greedy, 256 new tokens after a 16-token prompt.
        d = os.path.join(self.tmp.name, "hf124m")
        big = random_hf_model(seed=1, n_layer=12, n_head=12, n_embd=768, n_positions=1024).to(DEVICE)
        big.save_pretrained(d)
        prompt = list(range(1000, 1016))
        n = 256
        for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            rc, out, err = generate(d, "--ids", "--prompt", " ".join(map(str, prompt)), "--temperature", "0",
                                    "--max_new_tokens", str(n), "--ignore_eot", "--device", "cuda", "--dtype", dtype)
            self.assertEqual(rc, 0, err)
            ours = float(re.search(r": ([0-9.]+) tokens/s", err).group(1))
            m = big.to(torch_dtype)
            hf_greedy(m, prompt, 8)  # warm-up
            torch.cuda.synchronize()
            t0 = time.time()
            ref = hf_greedy(m, prompt, n)
            torch.cuda.synchronize()
            hf = n / (time.time() - t0)
            same = sum(a == b for a, b in zip(ids_of(out)[0], ref)) - len(prompt)
            print(f"[cuda {dtype}] gpt2-124m batch 1, {n} new tokens: gpt2-generate {ours:.1f} tokens/s, "
                  f"transformers generate {hf:.1f} tokens/s ({ours / hf:.2f}x); greedy tokens equal to HF: {same}/{n}")
            if dtype == "fp32":
                self.assertEqual(ids_of(out)[0], ref)


if __name__ == "__main__":
    unittest.main(verbosity=2)
