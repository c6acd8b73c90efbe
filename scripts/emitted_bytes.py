"""Export a representative set of models and record each .circle file's SHA-256, so a refactor
that must keep behaviour unchanged can show the emitted bytes are identical.

    PYTHONPATH=<tree A> python scripts/emitted_bytes.py --out a.json
    PYTHONPATH=<tree B> python scripts/emitted_bytes.py --out b.json --compare a.json

The set: a tiny Llama as float, int8-weights, q8_0 and q4_0; a small CNN (conv + batch norm +
relu + pool + linear); a tiny BERT; Qwen2, Gemma3 and Phi3 decoders (tests/families.py);
one LLM package (export_llm, two entry points). Everything is built from seeded random weights.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT)  # tests.families; PYTHONPATH picks the circle_fx under test


def _cnn():
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.SiLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    with torch.no_grad():
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 1.5)
    return m, (torch.randn(1, 3, 32, 32),), {}


def _bert():
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    return transformers.BertModel(cfg).eval(), (torch.randint(0, 256, (1, 8)),), {}


def _family(name):
    import torch

    from tests.families import BY_NAME, SEQ_LEN, VOCAB

    fam = BY_NAME[name]
    ids = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    return fam.build(), (ids,), fam.example_kwargs


CASES = [
    ("llama_float", lambda: _family("llama"), {}),
    ("llama_int8_weights", lambda: _family("llama"), {"quantize": "int8-weights"}),
    ("llama_q8_0", lambda: _family("llama"), {"quantize": "q8_0"}),
    ("llama_q4_0", lambda: _family("llama"), {"quantize": "q4_0"}),
    ("cnn", _cnn, {}),
    ("bert", _bert, {}),
    ("qwen2", lambda: _family("qwen2"), {}),
    ("qwen2_q4_0", lambda: _family("qwen2"), {"quantize": "q4_0"}),  # GGML FC with a bias
    ("qwen2_int8_weights", lambda: _family("qwen2"), {"quantize": "int8-weights"}),
    ("gemma3_text", lambda: _family("gemma3_text"), {}),
    ("phi3", lambda: _family("phi3"), {}),
    ("gpt_oss", lambda: _family("gpt_oss"), {}),
]


def main() -> int:
    import circle_fx

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where the {case: sha256} JSON goes")
    ap.add_argument("--compare", help="a JSON from another tree: print which cases differ, exit 1 if any")
    args = ap.parse_args()
    print(f"circle_fx from {os.path.dirname(circle_fx.__file__)}")
    digests = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, build, kw in CASES:
            model, inputs, kwargs = build()
            cm = circle_fx.export(model, inputs, example_kwargs=kwargs or None, verbose=False, **kw)
            path = os.path.join(tmp, f"{name}.circle")
            cm.save(path)
            with open(path, "rb") as f:
                digests[name] = hashlib.sha256(f.read()).hexdigest()
            print(f"  {name:20s} {os.path.getsize(path):>10,d} B  {digests[name][:16]}")
        model, _, _ = _family("llama")
        pkg = circle_fx.export_llm(model, max_seq_len=32)
        pkg_dir = os.path.join(tmp, "pkg")
        pkg.save(pkg_dir)
        for fn in sorted(os.listdir(pkg_dir)):
            if fn.endswith(".circle"):
                with open(os.path.join(pkg_dir, fn), "rb") as f:
                    digests[f"llm_package/{fn}"] = hashlib.sha256(f.read()).hexdigest()
                print(f"  llm_package/{fn:8s} {digests[f'llm_package/{fn}'][:16]}")
    with open(args.out, "w") as f:
        json.dump(digests, f, indent=1, sort_keys=True)
    if not args.compare:
        return 0
    with open(args.compare) as f:
        other = json.load(f)
    differ = sorted(k for k in set(digests) | set(other) if digests.get(k) != other.get(k))
    print(f"{len(digests) - len(differ)}/{len(digests)} identical" + (f"; DIFFER: {differ}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
