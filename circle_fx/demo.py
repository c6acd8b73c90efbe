"""``make demo``: export a tiny Llama to Circle, run it in onert, compare with PyTorch.

The model is a real ``transformers.LlamaForCausalLM`` built from a small config with
random weights (nothing is downloaded), so the whole round trip takes a few seconds and
exercises the same code path as a full-size checkpoint: capture, RMSNorm fusion,
lowering, writing, and execution in the on-device runtime.

``tiny_llama`` doubles as a CLI factory: ``circle-fx export circle_fx.demo:tiny_llama -o x.circle``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

#: max |onert - eager| on the logits that the demo accepts as a match
TOLERANCE = 1e-4


def tiny_llama(layers: int = 2, seq_len: int = 8, seed: int = 0):
    """A 2-layer ``LlamaForCausalLM`` (hidden 32, vocab 128) and example ``input_ids``."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:  # transformers is a test/demo extra, not a core dependency
        from .errors import InputError

        raise InputError("the demo needs transformers: pip install 'circle-fx[test]'") from e
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_cache=False)
    model = LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(seed))
    return model, (input_ids,)


def run_demo(out_dir: str = "demo_out", stream=None) -> float:
    """Export, save, run in onert and compare; returns the max abs difference on the logits."""
    import circle_fx

    stream = stream or sys.stdout

    def say(msg=""):
        print(msg, file=stream, flush=True)

    model, inputs = tiny_llama()
    say(f"tiny Llama: {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{model.config.num_hidden_layers} layers, input_ids {list(inputs[0].shape)}")
    start = time.perf_counter()
    cm = circle_fx.export(model, inputs)
    os.makedirs(out_dir, exist_ok=True)
    path = cm.save(os.path.join(out_dir, "tiny_llama.circle"))
    say(f"exported in {time.perf_counter() - start:.2f}s -> {path} ({cm.size:,} bytes)")

    start = time.perf_counter()
    (got,) = cm.run(*inputs)
    say(f"ran in onert in {time.perf_counter() - start:.2f}s")
    with torch.no_grad():
        want = model(*inputs).logits.numpy()
    diff = float(np.abs(got - want).max())
    verdict = "OK" if diff <= TOLERANCE else f"MISMATCH (tolerance {TOLERANCE:g})"
    say(f"logits {list(got.shape)}: max abs diff onert vs torch eager = {diff:.3g}  {verdict}")
    say()
    say(cm.summary())
    return diff


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m circle_fx.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="demo_out", help="where to write tiny_llama.circle (default: demo_out)")
    args = parser.parse_args(argv)
    from .quiet import preload_noisy_libraries

    preload_noisy_libraries()
    from .errors import CircleFxError

    try:
        diff = run_demo(args.out_dir)
    except CircleFxError as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    return 0 if diff <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
