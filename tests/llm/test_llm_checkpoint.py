"""``circle-fx export-llm PATH`` from a ``save_pretrained`` directory or a ``.gguf`` file, then
``circle-fx generate --prompt``: transformers' text in two commands, in onert."""
from __future__ import annotations

import json
import os

import pytest
import torch

import checkpoint
from circle_fx.circle.ggml_support import ggml_unsupported_reason
from circle_fx.cli import main
from llm_models import tiny
from text_models import tiny_tokenizer

PROMPT = "the name is bound in the block"


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ckpt") / "tiny_llama")
    tiny("llama").save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


def _transformers_text(model, tok, prompt, new_tokens, chat=False):
    ids = (tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)["input_ids"]
           if chat else tok(prompt).input_ids)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0, len(ids):]
    return tok.decode(out.tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("chat", [False, True])
def test_directory_to_text_in_two_commands(checkpoint_dir, tmp_path, capsys, chat):
    pkg = str(tmp_path / "pkg")
    assert main(["export-llm", checkpoint_dir, "-o", pkg, "--max-seq-len", "48", "--prefill-len", "8"]) == 0
    assert "tokenizer + chat template" in capsys.readouterr().out
    assert main(["generate", pkg, "--prompt", PROMPT, "--max-new-tokens", "16"] + (["--chat"] if chat else [])) == 0
    out, err = capsys.readouterr()
    want = _transformers_text(tiny("llama"), tiny_tokenizer(), PROMPT, 16, chat)
    assert out == want + "\n" and len(want) > 5 and "tokens/s" in err


def test_quantize_and_lengths(checkpoint_dir, tmp_path, capsys):
    float_pkg, q_pkg = str(tmp_path / "f"), str(tmp_path / "q")
    assert main(["export-llm", checkpoint_dir, "-o", float_pkg, "--max-seq-len", "20", "--prefill-len", "4"]) == 0
    assert main(["export-llm", checkpoint_dir, "-o", q_pkg, "--max-seq-len", "20", "--prefill-len", "4",
                 "--quantize", "int8-weights"]) == 0
    m = json.load(open(os.path.join(q_pkg, "manifest.json")))
    assert (m["max_seq_len"], m["prefill_len"]) == (20, 4)
    size = lambda d: os.path.getsize(os.path.join(d, "model.circle"))  # noqa: E731
    assert size(q_pkg) < 0.6 * size(float_pkg)
    capsys.readouterr()
    assert main(["generate", q_pkg, "--prompt", PROMPT, "--max-new-tokens", "6", "--ignore-eos"]) == 0
    assert "6 new tokens" in capsys.readouterr().err


def test_quantized_check_prompts_with_the_tokenizer_text(checkpoint_dir, tmp_path, capsys):
    """With a tokenizer, the quantized --check's prompt is CHECK_TEXT's ids (cut to max_seq_len / 2):
    text tells more about a real model than ids 1..5."""
    from circle_fx.llm.cli import CHECK_TEXT

    pkg = str(tmp_path / "q")
    assert main(["export-llm", checkpoint_dir, "-o", pkg, "--max-seq-len", "20", "--prefill-len", "4",
                 "--quantize", "int8-weights", "--int8-rows", "--check", "4"]) == 0
    out = capsys.readouterr().out
    assert f"prompt {tiny_tokenizer()(CHECK_TEXT).input_ids[:10]} + 4 greedy tokens" in out, out


def test_calibration_text_weights_the_q4_0_scales(checkpoint_dir, tmp_path, capsys):
    text = tmp_path / "calib.txt"
    text.write_text("the name is bound to the object in the block; a scope defines the visibility. " * 20)
    pkg = str(tmp_path / "q")
    assert main(["export-llm", checkpoint_dir, "-o", pkg, "--max-seq-len", "20", "--prefill-len", "4",
                 "--quantize", "q4_0", "--calibration", str(text)]) == 0
    out = capsys.readouterr().out
    assert "calibration: " in out and " tokens from 1 file(s)" in out
    # every linear of the tiny Llama (merged q/k/v and gate/up, o, down; the tied lm_head)
    assert "q4_0 scales weighted by activation importance: " in out and "none given" not in out, out
    assert "calibrated on " in out and " tokens of --calibration " in out, out
    # no file: the checkpoint (small) is read whole and calibrated on the built-in corpus, tokenized by the
    # package's tokenizer (circle_fx/quant/corpus.py)
    assert main(["export-llm", checkpoint_dir, "-o", str(tmp_path / "d"), "--max-seq-len", "20", "--prefill-len",
                 "4", "--quantize", "q4_0"]) == 0
    default = capsys.readouterr().out
    assert " tokens of the built-in corpus (pydoc topics)" in default, default
    if ggml_unsupported_reason():  # the package is written; this CPU cannot run GGML blocks
        assert main(["generate", pkg, "--prompt", PROMPT, "--max-new-tokens", "4"]) == 1
        return
    assert main(["generate", pkg, "--prompt", PROMPT, "--max-new-tokens", "4", "--ignore-eos"]) == 0
    assert "4 new tokens" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--calibration", "x.txt"], "--calibration weights a --quantize preset's Q4_0 scales; pass --quantize too"),
    (["--quantize", "q4_0", "--calibration", "/no/such/file.txt"], "--calibration /no/such/file.txt: cannot read"),
])
def test_calibration_errors(checkpoint_dir, tmp_path, capsys, extra, message):
    assert main(["export-llm", checkpoint_dir, "-o", str(tmp_path / "out"), "--max-seq-len", "20"] + extra) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("make, message", [
    (lambda d: os.makedirs(d), "no config.json"),
    (lambda d: None, "no such GGUF file"),
    (lambda d: (os.makedirs(d), open(os.path.join(d, "config.json"), "w").write("{not json")),
     "transformers could not load a causal LM"),
])
def test_bad_checkpoints_are_one_line_errors(tmp_path, capsys, make, message):
    path = str(tmp_path / ("model.gguf" if "GGUF" in message else "ckpt"))
    make(path)
    assert main(["export-llm", path, "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
@pytest.mark.skipif(not checkpoint.available(), reason=checkpoint.SKIP_REASON)
def test_gguf_file_to_chat_text(tmp_path, capsys):
    """The real SmolLM2-135M-Instruct GGUF (Q4_1, dequantized to float32 by transformers)."""
    gguf = os.path.join(checkpoint.checkpoint_dir(), checkpoint.GGUF_FILE)
    pkg = str(tmp_path / "smollm2")
    assert main(["export-llm", gguf, "-o", pkg, "--max-seq-len", "80", "--prefill-len", "32"]) == 0
    capsys.readouterr()
    question = "Name one planet of the solar system."
    assert main(["generate", pkg, "--prompt", question, "--chat", "--max-new-tokens", "20"]) == 0
    out = capsys.readouterr().out
    assert out == _transformers_text(checkpoint.load_model(), checkpoint.load_tokenizer(), question, 20, True) + "\n"
