"""Parameter counts of the four GPT-2 sizes: HF (instantiated on the meta device, no memory)
vs the published values vs our C++ count (hf_logits_probe count)."""
import os
import subprocess
import unittest

import torch
from transformers import GPT2Config, GPT2LMHeadModel

PROBE = os.path.join(os.environ.get("GPT2_TEST_BIN_DIR", "build/tests"), "hf_logits_probe")
SIZES = {  # name: (n_layer, n_head, n_embd, published count at vocab 50257)
    "gpt2": (12, 12, 768, 124_439_808),
    "gpt2-medium": (24, 16, 1024, 354_823_168),
    "gpt2-large": (36, 20, 1280, 774_030_080),
    "gpt2-xl": (48, 25, 1600, 1_557_611_200),
}


class ParamCount(unittest.TestCase):
    def test_counts_match_hf(self):
        if not os.path.exists(PROBE):
            self.skipTest(f"{PROBE} not built")
        for name, (n_layer, n_head, n_embd, published) in SIZES.items():
            with self.subTest(name):
                cfg = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=50257, n_positions=1024)
                with torch.device("meta"):
                    hf = GPT2LMHeadModel(cfg).num_parameters()
                ours = int(subprocess.check_output(
                    [PROBE, "count", str(n_layer), str(n_head), str(n_embd), "50257", "1024"], text=True))
                print(f"{name}: HF {hf:,}  ours {ours:,}")
                self.assertEqual(hf, published)
                self.assertEqual(ours, hf)


if __name__ == "__main__":
    unittest.main(verbosity=2)
