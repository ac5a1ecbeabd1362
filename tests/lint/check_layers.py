"""Layering check: a product source file may include headers of its own folder and of lower layers
only (docs/DESIGN.md "Layout"). Exit 1 listing every upward or sideways include, 0 when clean.

  python3 tests/lint/check_layers.py [ROOT]     # check the tree at ROOT (default: the repo)
  python3 tests/lint/check_layers.py --self-test # plant bad includes in a temporary tree
"""
import os, re, shutil, sys, tempfile

# Lowest first. Folders of one rank (data, parallel, src/kernels) may not include each other.
LAYERS = [("src/base", 0), ("data", 1), ("parallel", 1), ("src/kernels", 1), ("optim", 2),
          ("src/model", 3), ("src/io", 4), ("src/onnx", 4), ("src/train", 5), ("src/serve", 5),
          ("src/tools", 6)]
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    """The layer folder a repo-relative path lies in, or None."""
    for folder, _ in LAYERS:
        if path == folder or path.startswith(folder + "/"):
            return folder
    return None


def violations(root):
    rank = dict(LAYERS)
    found = []
    for folder, _ in LAYERS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        to = folder_of(target)
                        if to is None:
                            # Same-directory ("unicode_tables.inc") and third-party headers pass;
                            # tests/ and bench/ sit above everything the product builds.
                            if target.startswith(("tests/", "bench/")):
                                found.append(f"{path}:{lineno}: includes {target}, which is outside the product layers")
                            continue
                        if to == folder:
                            continue
                        if rank[to] >= rank[folder]:
                            found.append(f"{path}:{lineno}: {folder} (layer {rank[folder]}) includes {target} "
                                         f"from {to} (layer {rank[to]}); a layer may include only lower ones")
    return found


def self_test():
    """The check must pass a clean tree and name each planted upward include."""
    with tempfile.TemporaryDirectory() as d:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        write("src/base/errors.h", "#pragma once\n#include <string>\n")
        write("data/token_file.cpp", '#include "src/base/errors.h"\n#include "data/token_file.h"\n')
        write("src/train/trainer.cpp", '#include "src/io/checkpoint.h"\n#include "data/batch_loader.h"\n')
        clean = violations(d)
        assert clean == [], clean
        write("src/base/log.cpp", '#include "src/train/config.h"\n')         # upward
        write("data/corpus.cpp", '#include "parallel/rank_env.h"\n')         # sideways, same rank
        write("src/model/gpt2_model.cpp", '#include "tests/test_util.h"\n')  # out of the product
        bad = violations(d)
        assert len(bad) == 3, bad
        assert any(b.startswith("data/corpus.cpp:1:") and "parallel/rank_env.h" in b for b in bad), bad
        assert any(b.startswith("src/base/log.cpp:1:") and "src/train/config.h" in b for b in bad), bad
        assert any(b.startswith("src/model/gpt2_model.cpp:1:") for b in bad), bad
        print("self-test: a clean tree passes; 3 planted includes found:")
        for b in bad:
            print("  " + b)


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bad = violations(os.path.abspath(root))
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)" if bad else "layering: every include points down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
