"""The runner a device can run: ``circle_fx.llm.runner`` loads a package and generates with onert
and numpy alone (tokenizers for text), in a process where importing torch (or transformers)
fails. Greedy tokens equal transformers'; sampling falls back to numpy's processors and RNG
(seeded, reproducible; transformers-exact seeded sampling needs torch)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import circle_fx
from llm_models import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BLOCKER = '''import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(name + " is blocked: this process plays a device without torch")
sys.meta_path.insert(0, _NoTorch())
'''

SCRIPT = '''
import json, sys
try:
    import torch
    print(json.dumps({"torch": "importable"})); sys.exit(0)
except ImportError:
    pass
from circle_fx.llm.runner import LLMRunner
r = LLMRunner(sys.argv[1])
greedy = r.generate([3, 4, 5], 8, eos_token_ids=[])
sampled = [r.generate([3, 4, 5], 6, eos_token_ids=[], do_sample=True, top_k=20, top_p=0.9, temperature=0.8,
                      repetition_penalty=1.2, seed=7) for _ in range(2)]
print(json.dumps({"greedy": greedy, "sampled": sampled, "torch_loaded": "torch" in sys.modules}))
'''


def test_runner_generates_without_torch(tmp_path):
    model = tiny("llama")
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, tokenizer=None)
    pkg.save(tmp_path / "pkg")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path / "pkg")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "torch" not in out and out["torch_loaded"] is False
    import torch

    want = model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=8, do_sample=False, eos_token_id=None)[0].tolist()
    assert out["greedy"] == want
    a, b = out["sampled"]
    assert a == b and len(a) == 9 and all(0 <= t < model.config.vocab_size for t in a)  # seeded: reproducible


CLI = '''
import json, sys
from circle_fx.cli import main
code = main(["generate", sys.argv[1], "--prompt-ids", "3,4,5", "--max-new-tokens", "8", "--ignore-eos"])
print(json.dumps({"code": code, "torch_loaded": "torch" in sys.modules,
                  "compiler_loaded": any(m in sys.modules for m in ("circle_fx.api", "circle_fx.passes"))}))
'''


def test_cli_generate_without_torch(tmp_path):
    """``circle-fx generate`` is the runner's command line: with torch blocked it generates
    transformers' greedy tokens, and with torch installed it imports neither torch nor the compiler
    (its RSS is the runner's: benchmarks/llm_package.py)."""
    model = tiny("llama")
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, tokenizer=None)
    pkg.save(tmp_path / "pkg")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    import torch

    want = model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=8, do_sample=False, eos_token_id=None)[0].tolist()
    for blocked in (True, False):
        path = [str(tmp_path / "site"), ROOT] if blocked else [ROOT]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(CLI), str(tmp_path / "pkg")], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        lines = r.stdout.strip().splitlines()
        out = json.loads(lines[-1])
        assert out == {"code": 0, "torch_loaded": False, "compiler_loaded": False}, (blocked, out)
        assert [int(t) for t in lines[-2].split(",")] == want
