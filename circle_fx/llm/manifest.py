"""The package manifest (``manifest.json``): everything a C++ or Python host needs to
drive the package's Circle file without Python-side knowledge of the model.

Version 2 (written now; docs/llm-package.md compares it with ONE's layout field by field): one
``model.circle`` whose subgraph 0 is an IF dispatch over the two entry points (subgraph 1
``prefill``, 2 ``decode``, each with its SignatureDef); top-level ``"file": "model.circle"``,
``"config": "config.json"``, ``"entry": {"input": "entry", "index": 0, "prefill": true, "decode":
false}`` (the bool input choosing the entry point), ``"signatures"``; ``prefill``/``decode`` have
``"subgraph"`` instead of ``"file"``, and their ``index`` values are subgraph 0's slots (inputs:
``entry``, every prefill input, every decode input; outputs: every prefill output, then every
decode output). Bind every input once; after a run read only the outputs of the entry point run.
Version 1 (still read): ``prefill.circle`` and ``decode.circle``, a session each, as below.
Version 3: version 2 whose states may be carried two more ways (a version-2 reader would write them
wrong, so it must refuse the package). Value caches kept transposed, ``[1, H, D, S]``
(``cache.states[].axis`` and ``cache_writes[].axis`` 3: the decode step reads them without copying,
``dialect/attention.py``): the host writes a new row ``[1, H, 1, D]`` as column ``position`` and a prefill's
rows ``[1, H, n, D]`` as columns ``0..n-1``. Ring caches: a sliding-window layer's K/V
(``cache.states[].carry: "ring"``, with ``"ring": R`` rows and the model's ``"window": W``, R = W - 1
when W < max_seq_len) is a ``[1, H, R, D]`` buffer (never transposed); the host writes the row of position
``p`` at row ``p % R`` (prefill: only the prompt's last R rows), and the decode step masks the slots not
yet written. ``cache.bytes``: every state's bytes. A package with neither is written as version 2.
Buckets (version 2, absent in packages written before them = one bucket each): ``prefill.buckets`` /
``decode.buckets`` = ``{"lengths", "selector", "subgraphs"}``: the entry point is an IF chain over
models of those prompt lengths / cache rows, chosen in the graph by ``last_index`` / ``position``
(the smallest that holds it); the host does nothing different (docs/llm-package.md "Buckets").

Schema (``format: "circle_fx.llm"``, ``version: 1``; version 2 as said above)::

    {
      "format": "circle_fx.llm", "version": 1,
      "model": {"architecture", "model_type", "vocab_size", "num_layers",
                "num_kv_heads", "head_dim",   # null when the caches differ (see cache.shapes)
                "dtype"},
      "max_seq_len": S,            # cache rows per layer: positions 0..S-1
      "prefill_len": P,            # prefill.circle takes exactly P ids (right-pad shorter prompts)
      "sliding_window": W | null,  # the masks inside the models; the sliding layers' K/V are rings (v3)
      "attention_chunk": C | null, # chunked attention (Llama 4): also in the masks (no host work)
      "eos_token_ids": [...], "bos_token_id": b | null, "pad_token_id": p | null,
      "cache": {"layout": "BHSD", "dtype": "float32", "initial": 0.0,
                "names": ["key_cache_0", "value_cache_0", "conv_cache_1", ...],  # every state, input order
                "shapes": {"key_cache_0": [1, H, S, D], ...},     # each state's own shape
                "shape": [1, H, S, D] | null,                     # the shape when all are equal K/V
                "states": [{"name": "conv_cache_1", "output": "conv_1", "kind": "conv",  # key/value/indexer/conv/recurrent
                            "layer": 1, "index": 0,               # transformers' layer_idx / state_idx
                            "shape": [...], "dtype": "float32",
                            "carry": "replace" | "position" | "ring",
                            "ring": R, "window": W}, ...],       # ring only (version 3)
                "bytes": N},                                      # version 3
      "prefill": {"file": "prefill.circle", "pads": true | false,   # false: exact-length prompts only
                  "inputs": [IO...], "outputs": [IO...],
                  "cache_writes": [{"output": "key_0", "cache": "key_cache_0", "axis": 2,
                                    "first_cache_row": 0, "count": "length",
                                    "rows": "0..length-1 -> positions 0..length-1"},
                                   {"output": "key_1", "cache": "key_cache_1", "carry": "ring", "axis": 2,
                                    "ring": R, "first_position": 0, "count": "length",
                                    "rows": "..."}, ...]},   # ring: row i -> cache row i % R, last R only
      "decode":  {"file": "decode.circle", "inputs": [IO...], "outputs": [IO...],
                  "cache_writes": [{"output": "key_0", "cache": "key_cache_0", "axis": 2,
                                    "first_cache_row": "position", "count": 1,
                                    "rows": "0 -> position"}, ...],
                  "recompute": null | {"why": "...", "cost": "..."}},  # see "Recompute" below
      "weights": {"quantize": {"weights", "embedding", "lm_head", "overrides": [[PATTERN, MODE], ...],
                               "importance": {"samples", "rows", "names"} | null, ...} | null,
                  "prefill": {NAME: ENCODING, ...}, "decode": {NAME: ENCODING, ...},  # per quantized weight
                  "bits_per_weight": {ENCODING: bits, ...},
                  "ggml": bool,               # GGML_Q8_0 / GGML_Q4_0 tensors in the files
                  "num_threads": 1 | null,    # what to set onert's NUM_THREADS to (null: onert's default)
                  "num_threads_why": "..."},
      "text": {"tokenizer": "tokenizer.json" | null,        # HF `tokenizers` format
               "chat_template": "chat_template.jinja" | null, # jinja2, rendered as transformers does
               "special_tokens": {"bos_token": "...", "eos_token": "...", ...},  # template variables
               "generation_config": "generation_config.json" | null}  # transformers' GenerationConfig
    }

Each part also has ``"limits"``: the ``circle_fx.limits`` metadata its file carries (valid
``index_range`` of ``input_ids`` = the vocabulary, of ``position`` = ``0..max_seq_len-1``, of
``last_index`` = ``0..prefill_len-1``; ``max_seq_len``); a host must keep its inputs inside them
(the files clamp ids into the table, which is still a wrong answer for a bad id).

``weights``: how each model stores its weights. NAME is the weight's module name (members of a
merged q/k/v or gate/up weight joined by ``+``), ENCODING one of ``q4_0``, ``q8_0`` (GGML blocks),
``int8`` (per-row int8 + MUL by the row scales), ``uint8`` (embedding rows, zero point 128);
a tied weight stored once per encoding reads ``q8_0+uint8``; a weight not listed is float32.
The two files may differ: with ``int8`` weights the prefill's linears (``prefill_len`` >= 16 rows)
are ``q8_0`` and the decode's ``int8`` (``QuantConfig.blocks_from_rows``: the faster kernel per row count).
``num_threads``: onert reads the ``NUM_THREADS`` environment variable when it prepares a session
(``nnfw_prepare``, per session); for these files 1 is the safe value: ggml's threads spin-wait, so
on a 2-core AVX-512 host two threads were 1.15-1.5x faster at decode and 1.5-1.8x at prefill when the
second core was idle, and 2-10x slower when it was busy (``LLMRunner`` and ``CircleModel.run`` set
it, unless ``NUM_THREADS`` is already set, to the number of cores idle when they prepare a session,
``circle_fx.circle.ggml_support.ggml_thread_count``); float models keep onert's
default, whose multithreaded CONV_2D speeds up prefill.

``IO`` = ``{"name", "index", "shape", "dtype"}``; ``index`` is the onert input/output
slot. Protocol (what :class:`~circle_fx.llm.runner.LLMRunner` does):

States are what each layer hands to transformers' cache (``Cache.update`` for K/V,
``update_indexer`` for a sparse-attention indexer's keys, carried as ``[1, 1, S, D]``, ``update_conv_state`` / ``update_recurrent_state`` for short-convolution windows and SSM /
linear-attention states). ``carry: "position"`` (K/V, indexer keys): the outputs are new rows the host writes
at the token's position (``cache_writes``); ``carry: "replace"``: the output is the whole next
state, which replaces the input after every call. A model with any ``replace`` state has
``prefill.pads`` false: a right-padded prompt would leave the state after the padding, so
prefill takes exactly ``prefill_len`` ids and a shorter prompt goes through decode steps.

Cache shapes are what each layer hands to transformers' ``Cache.update``, read per layer:
they differ between layers (Gemma 4's per-layer head_dim) and between K and V (MLA caches
its compressed latent as K and the shared rotary key as V, DeepSeek-V3); a layer that reuses
another layer's K/V (Gemma 3n / 4) has no cache, so ``i`` in ``key_cache_i`` is the layer.

1. allocate the caches (``cache.shapes``, zeros), bind them to the decode session once;
2. prefill: ``input_ids`` [1,P] int32 = prompt right-padded with ``pad_token_id`` (any id
   works: padding never influences real tokens), ``last_index`` [1] int32 = length-1;
   run; copy rows ``0..length-1`` of each ``key_i``/``value_i`` output into its cache at
   the same positions, and each ``replace`` state's output over its input; ``logits`` [1,1,V]
   are the next-token logits;
3. decode at position ``p`` (``p < S``): ``input_ids`` [1,1], ``position`` [1] = p; run;
   write row 0 of every ``key_i``/``value_i`` output into its cache at row ``p``, and copy
   each ``replace`` state's output over its input.

A ``ring`` state (version 3) is written the same way at row ``position % ring`` instead: in
step 2 output rows ``max(0, length-ring)..length-1`` go to rows ``q % ring``, in step 3 row 0
goes to row ``p % ring``.

Recompute (``decode.recompute`` not null; absent in older packages = null): the model carries
no state (``cache.names`` empty; its forward takes no cache, or would derive wrong positions
from one). ``decode.circle`` then takes ``input_ids`` [1,S] (every id so far at positions
0..p, right-padded with ``pad_token_id``) and ``last_index`` [1] = p, and returns the logits at
p: the host keeps the ids and writes each new one at its position; prefill is as above, with
nothing to copy. Exact for the causal decoders export_llm accepts; each step costs a forward
over S ids.

Text: encode a plain prompt with the tokenizer's own special tokens (its post-processor adds
BOS if the model wants one); a chat prompt is the template rendered with ``messages``,
``add_generation_prompt=True`` and the special tokens, encoded without adding any. Decode
the new ids skipping special tokens. The ``text`` section is absent in packages written
before it existed (ids only).

A prompt longer than P is prefilled in its first P tokens and fed to decode one token
at a time after that.
"""
from __future__ import annotations

import json
import os

from ..errors import InputError

FORMAT, VERSION = "circle_fx.llm", 2
#: the versions :func:`read` accepts: 1 = prefill.circle + decode.circle (two sessions), 2 = model.circle,
#: 3 = model.circle whose value caches may be kept transposed (a state's ``axis`` 3: ``[1, H, D, S]``, the
#: host writes the new rows as columns) and whose sliding-window layers may carry ring caches
#: (``carry: "ring"``): :data:`STATES_VERSION`
VERSIONS = (1, 2, 3)
#: the version of a package with a transposed or a ring state: a host reading version 2 would write its
#: rows on axis 2 / at the position (wrong), so it must refuse the package instead
STATES_VERSION = 3
#: ``cache.states[].carry`` values: written at the position / at ``position % ring`` / replaced
RING = "ring"
FILE = "manifest.json"
MODEL_FILE = "model.circle"
#: transformers' config of the model, as ONE's runner (runtime/ggma) reads it
CONFIG_FILE = "config.json"
#: where each entry point is in model.circle (subgraph 0 is the IF dispatch onert 0.1.0 runs)
SUBGRAPHS = {"prefill": 1, "decode": 2}
ENTRY = {"input": "entry", "index": 0, "prefill": True, "decode": False}


def io_entries(builder, which: str, prefix: str | None = None) -> list[dict]:
    """Name/slot/shape/dtype of a built model's inputs or outputs; with ``prefix`` (one-file
    model: ``"decode."``) only that entry point's, named without it, ``index`` the main graph's slot."""
    from ..circle.schema import CIRCLE_TO_NUMPY

    idxs = builder.inputs if which == "inputs" else builder.outputs
    names = builder.input_names if which == "inputs" else builder.output_names
    out = []
    for k, (name, t) in enumerate(zip(names, idxs)):
        if prefix is not None and not name.startswith(prefix):
            continue
        tensor = builder.tensors[t]
        out.append({"name": name[len(prefix):] if prefix else name, "index": k,
                    "shape": [int(d) for d in tensor.shape], "dtype": str(CIRCLE_TO_NUMPY[tensor.type])})
    return out


def one_file_entries(builder) -> dict:
    """The top-level manifest keys of a one-file package (version 2)."""
    return {"file": MODEL_FILE, "config": CONFIG_FILE, "entry": dict(ENTRY),
            "signatures": {"dispatch": 0, **SUBGRAPHS}}


#: the input choosing each entry point's bucket (a bucket of length n runs when it is < n)
BUCKET_SELECTORS = {"prefill": "last_index", "decode": "position"}


def buckets_entry(builder, part: str, lengths: list) -> dict:
    """``prefill.buckets`` / ``decode.buckets`` (version 2): the bucket lengths (ascending, the
    last = prefill_len / max_seq_len), the input that picks one in the graph and each bucket's
    subgraph. Nothing for the host to do: it binds and reads the entry point's inputs and outputs
    as without buckets (a prefill bucket's K/V outputs are padded to prefill_len rows)."""
    if len(lengths) == 1:
        return {"lengths": list(lengths), "selector": BUCKET_SELECTORS[part], "subgraphs": [SUBGRAPHS[part]]}
    names = {g.name: k + 1 for k, g in enumerate(builder.subgraphs)}
    return {"lengths": list(lengths), "selector": BUCKET_SELECTORS[part],
            "subgraphs": [names[f"{part}_{n}"] for n in lengths]}


def config_json(model) -> str:
    """``config.json``: the model's transformers config (what ONE's runner reads: num_hidden_layers,
    hidden_size, num_attention_heads, vocab_size, max_position_embeddings, bos/eos_token_id)."""
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    try:
        return cfg.to_json_string(use_diff=False)
    except Exception:  # a config with a value JSON cannot hold: the fields ONE reads
        keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings",
                "bos_token_id", "eos_token_id", "model_type")
        return json.dumps({k: getattr(cfg, k, None) for k in keys}, indent=2)


def one_file(manifest: dict) -> bool:
    """Is the package one ``model.circle`` (versions 2, 3) rather than prefill.circle + decode.circle
    (version 1, and the two-file comparison layout of a version-3 package with ring caches:
    ``LLMPackage.save(layout="two")``)? The one-file manifests name their file at the top level."""
    return manifest.get("version", 1) >= 2 and "file" in manifest


def model_files(manifest: dict) -> list[str]:
    """The Circle files of a package: model.circle (versions 2, 3), or prefill.circle + decode.circle."""
    if one_file(manifest):
        return [manifest["file"]]
    return [manifest[part]["file"] for part in ("prefill", "decode")]


def states(caches, window=None) -> list[dict]:
    """One entry per state tensor (:class:`~circle_fx.llm.cache.State`): what it is and how the
    host carries it between calls; a ring (``carry: "ring"``, version 3) also names its rows and
    the model's sliding window, a transposed value cache (version 3) its ``axis``."""
    out = []
    for c in caches:
        entry = {"name": c.name, "output": c.output, "kind": c.kind, "layer": c.layer, "index": c.index,
                 "shape": list(c.shape), "dtype": "float32", "carry": c.carry}
        if c.carry == "position":
            entry["axis"] = c.axis
        if c.carry == RING:
            entry.update(ring=c.ring, window=window)
        out.append(entry)
    return out


#: what a package that recomputes pays (manifest ``decode.recompute.cost``)
RECOMPUTE_COST = ("no cache: every decode step runs the whole max_seq_len window (a max_seq_len-token forward "
                  "per new token, like a prefill of max_seq_len ids), instead of one token against a cache")


def recompute_entry(why: str | None) -> dict | None:
    """``decode.recompute``: null when the decode model carries states; else why it cannot and the cost."""
    return None if why is None else {"why": why, "cost": RECOMPUTE_COST}


def cache_writes(caches, rows: str, first_cache_row, count) -> list[dict]:
    """One entry per state. ``carry: "position"`` (K/V): output rows ``0..count-1`` (along
    ``axis``) go to cache rows ``first_cache_row..``; ``first_cache_row``/``count`` are ints or
    the names of run-time values (``"position"``, ``"length"``); ``rows`` says the same in words.
    ``carry: "ring"`` (a sliding-window layer's K/V, version 3): output row ``i`` is position
    ``first_position + i``, written at cache row ``(first_position + i) % ring``; of ``count``
    rows only the last ``ring`` are written (the earlier ones would be overwritten).
    ``carry: "replace"`` (conv / recurrent states): the output is the whole next state."""
    out = []
    for c in caches:
        if c.carry == "position":
            out.append({"output": c.output, "cache": c.name, "carry": c.carry, "axis": c.axis,
                        "first_cache_row": first_cache_row, "count": count, "rows": rows})
        elif c.carry == RING:
            out.append({"output": c.output, "cache": c.name, "carry": c.carry, "axis": 2, "ring": c.ring,
                        "first_position": first_cache_row, "count": count,
                        "rows": f"0 -> position % {c.ring}" if count == 1 else
                                f"q -> q % {c.ring} for q in max(0, {count}-{c.ring})..{count}-1"})
        else:
            out.append({"output": c.output, "cache": c.name, "carry": c.carry})
    return out


#: why a package with GGML weights asks for one onert thread (``weights.num_threads_why``)
GGML_THREADS_WHY = ("onert's ggml kernels (GGML_Q8_0/Q4_0 FULLY_CONNECTED) spin-wait: on a 2-core host, two "
                    "threads were 1.15-1.5x faster at decode and 1.5-1.8x at a 128-token prefill than one when the "
                    "other core was idle, and 2-10x slower when it was busy (measured 2026-12-05; "
                    "docs/onert-findings.md). 1 is the safe value; LLMRunner and CircleModel.run use the cores idle "
                    "when they prepare a session. onert reads NUM_THREADS when it prepares a session")


def weights_entry(quantize, decode, prefill) -> dict:
    """The manifest's ``weights`` section from the two models' quantization records."""
    from dataclasses import fields

    def value(k, v):
        if k in ("overrides", "skip"):
            return [list(o) if isinstance(o, tuple) else o for o in v]
        if k == "importance":  # the statistics themselves stay out: where they came from
            return None if v is None else {"samples": v.samples, "rows": v.rows, "names": len(v),
                                           "source": getattr(v, "source", None)}
        return v

    records = {part: cm.report.quantization for part, cm in (("prefill", prefill), ("decode", decode))}
    out = {"quantize": None if quantize is None else
           {f.name: value(f.name, getattr(quantize, f.name)) for f in fields(quantize)}}
    bits, ggml = {}, False
    for part, record in records.items():
        out[part] = record.encodings() if record is not None else {}
        if record is not None:
            bits.update({k: round(v, 3) for k, v in record.bits_per_weight().items()})
            ggml = ggml or any(k in ("q4_0", "q8_0") for k in record.sizes)
    out.update(bits_per_weight=bits, ggml=ggml, num_threads=1 if ggml else None,
               num_threads_why=GGML_THREADS_WHY if ggml else "float/int8 weights: onert's default threads "
               "(its multithreaded CONV_2D speeds up prefill)")
    return out


def asset_files(manifest: dict) -> list[str]:
    """The text files the manifest names (tokenizer, chat template, generation config)."""
    text = manifest.get("text") or {}
    return [text[k] for k in ("tokenizer", "chat_template", "generation_config") if text.get(k)] + (
        [manifest["config"]] if manifest.get("config") else [])


def write(directory: str, manifest: dict) -> str:
    path = os.path.join(directory, FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, path)
    return path


def read(directory: str) -> dict:
    """The manifest of a package directory, checked enough to give clear errors."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise InputError(f"{directory}: no such directory (expected a package written by export_llm(...).save)")
    path = os.path.join(directory, FILE)
    if not os.path.isfile(path):
        raise InputError(f"{directory}: no {FILE}; not a circle_fx LLM package")
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable manifest: {e}") from e
    if m.get("format") != FORMAT or m.get("version") not in VERSIONS:
        raise InputError(f"{path}: format {m.get('format')!r} version {m.get('version')!r}; "
                         f"this circle_fx reads {FORMAT!r} versions {', '.join(map(str, VERSIONS))}")
    for name in model_files(m) + asset_files(m):
        if not os.path.isfile(os.path.join(directory, name)):
            raise InputError(f"{directory}: {name} is missing (named in {FILE})")
    return m
