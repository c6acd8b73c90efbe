"""A tiny tokenizer for the text tests, built with the `tokenizers` library (nothing downloaded):
BPE with a Metaspace pre-tokenizer trained on a pydoc text, at most 128 ids so it fits the tiny
models of ``llm_models.py``, wrapped as a transformers fast tokenizer with a chat template."""
from __future__ import annotations

import functools

CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}")


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=128, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60)
    tok.train_from_iterator([topics["execmodel"], topics["compound"]], trainer)
    assert tok.get_vocab_size() <= 128
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=CHAT_TEMPLATE)
