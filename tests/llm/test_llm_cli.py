"""``circle-fx export-llm`` and ``circle-fx generate``, in-process and their errors."""
from __future__ import annotations

import os

import pytest
import torch

from circle_fx.cli import main
from llm_models import tiny

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where llm_models.py lives
FACTORY = os.path.join(HERE, "llm_models.py") + ":tiny_llama_factory"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cli") / "pkg")
    assert main(["export-llm", FACTORY, "-o", out, "--max-seq-len", "24", "--prefill-len", "4", "--check",
                 "--decode-buckets", "8,16"]) == 0
    return out


def test_export_then_generate_matches_transformers(package, capsys):
    assert sorted(os.listdir(package)) == ["config.json", "generation_config.json", "manifest.json", "model.circle"]
    from circle_fx.llm import LLMPackage

    assert LLMPackage.load(package).manifest["decode"]["buckets"]["lengths"] == [8, 16, 24]  # crossed below
    capsys.readouterr()
    assert main(["generate", package, "--prompt-ids", "3,4,5,6,7", "--max-new-tokens", "12", "--ignore-eos"]) == 0
    got = [int(t) for t in capsys.readouterr().out.strip().split(",")]
    want = tiny("llama").generate(torch.tensor([[3, 4, 5, 6, 7]]), max_new_tokens=12, do_sample=False,
                                  eos_token_id=None)[0].tolist()
    assert got == want


@pytest.mark.parametrize("argv, message", [
    (["generate", "{pkg}", "--prompt-ids", ",".join(["1"] * 25)], "the prompt has 25 tokens"),
    (["generate", "{pkg}", "--prompt-ids", "1,2", "--max-new-tokens", "30"], "needs 31 cache positions"),
    (["generate", "{pkg}", "--prompt-ids", "1,x"], "comma-separated integers"),
    (["generate", "{missing}", "--prompt-ids", "1"], "no such directory"),
    (["export-llm", "no_such_module_xyz:f", "-o", "{missing}", "--max-seq-len", "8"], "no module named"),
    (["export-llm", FACTORY, "-o", "{missing}", "--decode-buckets", "8,x"], "bucket lengths must be"),
    (["export-llm", FACTORY, "-o", "{missing}", "--max-seq-len", "24", "--decode-buckets", "30"],
     "decode bucket lengths must be in 1..24"),
])
def test_errors_are_one_line(package, tmp_path, capsys, argv, message):
    argv = [a.format(pkg=package, missing=str(tmp_path / "missing")) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.startswith("circle-fx ")
    assert not os.path.exists(tmp_path / "missing")
