"""Text in, text out: the package stores the tokenizer, chat template and generation config;
``LLMRunner.generate_text`` / ``stream_text`` and ``circle-fx generate --prompt`` give
transformers' text (tokenizer + ``model.generate`` + ``decode``), in onert."""
from __future__ import annotations

import json
import os

import pytest
import torch

import checkpoint
from circle_fx import InputError, export_llm
from circle_fx.cli import main
from circle_fx.llm import LLMRunner
from llm_models import tiny
from text_models import tiny_tokenizer

PROMPT = "the name is bound in the block"


@pytest.fixture(scope="module")
def model():
    return tiny("llama")


@pytest.fixture(scope="module")
def package(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("text") / "pkg")
    export_llm(model, max_seq_len=64, prefill_len=8, tokenizer=tiny_tokenizer()).save(out)
    return out


def _want(model, ids, new_tokens, **kw):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, **kw)[0].tolist()
    return out[len(ids):]


def test_package_names_its_text_files(package):
    files = sorted(os.listdir(package))
    assert files == ["chat_template.jinja", "config.json", "generation_config.json", "manifest.json",
                     "model.circle", "tokenizer.json"]
    text = json.load(open(os.path.join(package, "manifest.json")))["text"]
    assert text["tokenizer"] == "tokenizer.json" and text["chat_template"] == "chat_template.jinja"
    assert text["special_tokens"]["eos_token"] == "</s>"
    assert open(os.path.join(package, "chat_template.jinja")).read() == tiny_tokenizer().chat_template


@pytest.mark.parametrize("messages", [PROMPT, [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": PROMPT}]])
def test_ids_are_transformers_ids(package, messages):
    tok, runner = tiny_tokenizer(), LLMRunner(package)
    if isinstance(messages, str):
        assert runner.encode(messages) == tok(messages).input_ids
        messages = [{"role": "user", "content": messages}]
    assert runner.encode(messages, chat=True) == tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


@pytest.mark.parametrize("chat", [False, True])
def test_generate_text_is_transformers_text(package, model, chat):
    tok, runner = tiny_tokenizer(), LLMRunner(package)
    ids = runner.encode(PROMPT, chat=chat)
    want = tok.decode(_want(model, ids, 20, eos_token_id=None), skip_special_tokens=True)
    got = runner.generate_text(PROMPT, max_new_tokens=20, chat=chat, eos_token_ids=[])
    assert got == want and len(got) > 5
    pieces = list(runner.stream_text(PROMPT, max_new_tokens=20, chat=chat, eos_token_ids=[]))
    assert "".join(pieces) == want and len(pieces) > 3  # really streamed, not one piece at the end


def test_cli_streams_text_and_reports_speed(package, model, capsys):
    assert main(["generate", package, "--prompt", PROMPT, "--max-new-tokens", "12", "--ignore-eos"]) == 0
    out, err = capsys.readouterr()
    ids = tiny_tokenizer()(PROMPT).input_ids
    assert out == tiny_tokenizer().decode(_want(model, ids, 12, eos_token_id=None), skip_special_tokens=True) + "\n"
    assert "12 new tokens" in err and "tokens/s" in err


def test_package_without_tokenizer_says_so(model, tmp_path, capsys):
    out = str(tmp_path / "ids_only")
    export_llm(model, max_seq_len=16, prefill_len=4, tokenizer=None).save(out)
    assert "tokenizer.json" not in os.listdir(out) and "generation_config.json" in os.listdir(out)
    with pytest.raises(InputError, match="no tokenizer"):
        LLMRunner(out).generate_text("hello")
    assert main(["generate", out, "--prompt", "hello"]) == 1
    assert "no tokenizer" in capsys.readouterr().err


def test_cli_prompt_arguments_are_checked(package, capsys):
    assert main(["generate", package]) == 1
    assert "exactly one of --prompt" in capsys.readouterr().err
    assert main(["generate", package, "--prompt-ids", "1,2", "--chat"]) == 1
    assert "--chat applies" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not checkpoint.available(), reason=checkpoint.SKIP_REASON)
def test_real_checkpoint_chat_text(tmp_path):
    """SmolLM2-135M-Instruct: the chat answer onert streams is transformers' answer, to the token."""
    model, tok = checkpoint.load_model(), checkpoint.load_tokenizer()
    out = str(tmp_path / "smollm2")
    export_llm(model, max_seq_len=96, prefill_len=48, tokenizer=tok).save(out)
    runner = LLMRunner(out)
    question = "What is the capital of France?"
    ids = runner.encode(question, chat=True)
    assert ids == tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)["input_ids"]
    with torch.no_grad():
        want_ids = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    want = tok.decode(want_ids, skip_special_tokens=True)
    got = "".join(runner.stream_text(question, max_new_tokens=24, chat=True))
    assert got == want and "Paris" in got
