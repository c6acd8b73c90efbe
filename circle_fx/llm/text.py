"""Text in, text out: the tokenizer, chat template and generation config of a package.

Export side (:func:`text_assets`): a transformers tokenizer (or a ``tokenizers.Tokenizer``,
or a path to a ``tokenizer.json`` / a ``save_pretrained`` directory) becomes files of the
package -- ``tokenizer.json`` (the ``tokenizers`` library's own format, which a C++ host can
read with the HF tokenizers C bindings or any port), ``chat_template.jinja`` and
``generation_config.json`` -- and a ``text`` section of the manifest naming them plus the
special tokens the template refers to.

Host side (:class:`TextCodec`): ``tokenizers`` (a dependency of transformers, no torch) for
encode/decode, ``jinja2`` for the chat template, rendered the way transformers'
``apply_chat_template`` renders it (sandboxed, ``trim_blocks``/``lstrip_blocks``, the same
``raise_exception`` / ``tojson`` / ``strftime_now`` helpers), so the ids are transformers'.
"""
from __future__ import annotations

import json
import os

from ..errors import InputError

TOKENIZER_FILE = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"


# ----------------------------------------------------------------------------- export side
def _backend(tokenizer):
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` and the transformers object (or None)."""
    import tokenizers

    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer, None
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if os.path.isfile(path):
            try:
                return tokenizers.Tokenizer.from_file(path), None
            except Exception as e:
                raise InputError(f"{path}: not a tokenizers tokenizer.json: {e}") from e
        if os.path.isdir(path):
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
            except Exception as e:
                raise InputError(f"{path}: transformers could not load a tokenizer from it: "
                                 f"{type(e).__name__}: {e}") from e
        else:
            raise InputError(f"tokenizer {path}: no such file or directory")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InputError(f"the tokenizer ({type(tokenizer).__name__}) has no `tokenizers` backend "
                         "(backend_tokenizer); export_llm stores tokenizer.json, which needs a fast tokenizer")
    return backend, tokenizer


def text_assets(tokenizer, model) -> tuple[dict, dict[str, str]]:
    """The manifest's ``text`` section and the files it names (name -> contents).

    ``tokenizer`` None stores only the generation config (a package of token ids)."""
    files: dict[str, str] = {}
    section: dict = {"tokenizer": None, "chat_template": None, "special_tokens": {}, "generation_config": None}
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        files[GENERATION_CONFIG_FILE] = gen.to_json_string(use_diff=True)
        section["generation_config"] = GENERATION_CONFIG_FILE
    if tokenizer is None:
        return section, files
    backend, hf = _backend(tokenizer)
    files[TOKENIZER_FILE] = backend.to_str()
    section["tokenizer"] = TOKENIZER_FILE
    template = getattr(hf, "chat_template", None) if hf is not None else None
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    if isinstance(template, str):
        files[CHAT_TEMPLATE_FILE] = template
        section["chat_template"] = CHAT_TEMPLATE_FILE
    if hf is not None:
        section["special_tokens"] = {k: str(v) for k, v in hf.special_tokens_map.items() if isinstance(v, str)}
    return section, files


def text_encoder(tokenizer):
    """``text -> ids`` (no special tokens) for what ``export_llm(tokenizer=...)`` takes, or None
    for None: the q4_0 calibration tokenizes its built-in corpus with it."""
    if tokenizer is None:
        return None
    backend, _ = _backend(tokenizer)
    return lambda text: backend.encode(text, add_special_tokens=False).ids


def default_tokenizer(model):
    """The tokenizer saved next to the model's weights, when the model came from a local
    ``save_pretrained`` directory that has one; else None."""
    path = getattr(getattr(model, "config", None), "_name_or_path", None) or ""
    if path and os.path.isfile(os.path.join(path, TOKENIZER_FILE)):
        return path
    return None


# ------------------------------------------------------------------------------- host side
def _chat_environment():
    """A jinja2 environment configured as transformers' ``_compile_jinja_template``."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class TextCodec:
    """Encode prompts (plain or chat) to ids and decode generated ids, from a package's files."""

    def __init__(self, directory: str, section: dict | None):
        if not section or not section.get("tokenizer"):
            raise InputError(f"{directory}: the package has no tokenizer (export_llm(..., tokenizer=...) stores one); "
                             "use token ids (generate / --prompt-ids)")
        import tokenizers

        path = os.path.join(directory, section["tokenizer"])
        try:
            self.tokenizer = tokenizers.Tokenizer.from_file(path)
        except Exception as e:
            raise InputError(f"{path}: unreadable tokenizer: {e}") from e
        self.special_tokens = dict(section.get("special_tokens") or {})
        self.template = None
        if section.get("chat_template"):
            with open(os.path.join(directory, section["chat_template"])) as f:
                self.template_source = f.read()
            self.template = _chat_environment().from_string(self.template_source)

    def render_chat(self, messages) -> str:
        """The chat template applied to ``messages`` (a string = one user message), with the
        assistant's turn opened (``add_generation_prompt=True``)."""
        if self.template is None:
            raise InputError("the package has no chat template (the tokenizer had none); generate without chat")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.special_tokens)
        except Exception as e:
            raise InputError(f"the chat template failed: {type(e).__name__}: {e}") from e

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """``prompt`` to ids as transformers does: ``tokenizer(prompt)`` (special tokens such as
        BOS added by the tokenizer's post-processor), or ``apply_chat_template`` (the rendered
        text already has them, none added)."""
        if chat:
            return self.tokenizer.encode(self.render_chat(prompt), add_special_tokens=False).ids
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a string, got {type(prompt).__name__} (a message list needs chat=True)")
        return self.tokenizer.encode(prompt).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream(self, tokens):
        """Text pieces as ``tokens`` (an iterator of ids) arrive; their concatenation is
        ``decode(all ids)``. A piece is held back while the text ends in an incomplete
        UTF-8 sequence (byte-level tokens split characters)."""
        ids: list[int] = []
        emitted = ""
        for t in tokens:
            ids.append(t)
            text = self.decode(ids)
            if text.endswith("\ufffd"):
                continue
            if text.startswith(emitted):
                piece, emitted = text[len(emitted):], text
            else:  # a later token changed earlier text (rare): emit nothing until it agrees again
                continue
            if piece:
                yield piece
        text = self.decode(ids)
        if text.startswith(emitted) and len(text) > len(emitted):
            yield text[len(emitted):]
