"""Generate docs/arm64-support.md: circle_fx's files on onert's aarch64 build (qemu-user) beside x86 onert and eager.

    PYTHONPATH=$PWD python scripts/arm64.py setup                       # the cached arm64 side, once (~40 s)
    PYTHONPATH=$PWD python scripts/arm64_support.py --cover -j1         # x86 only: every family's op forms -> docs/arm64-cover.json (~20 min)
    PYTHONPATH=$PWD python scripts/arm64_support.py -j1 [--cache=F]     # the table (docs/arm64-support.{md,json})
    PYTHONPATH=$PWD python scripts/arm64_support.py llama/q4_0 pkg/q8_0 # named rows, table not written

**Which files.** The decoder and encoder families are not hand-picked: ``--cover`` exports (float,
x86 only) every family of docs/model-support and docs/encoder-support that exports, reads each file's
*op forms* (operator name + its input tensors' element types, ``/pc`` for per-channel quantized:
``FULLY_CONNECTED(FLOAT32,INT8,FLOAT32)`` is another kernel than the float one) and keeps a greedy set
cover: families are added, most new forms first, until every form any family's file has is in one of
them. On top of that cover: every weight mode (float, int8-weights, q8_0, q4_0, q4_0-mix) on
:data:`WEIGHT_FAMILIES`, PT2E uint8 (a decoder and a CNN), the int8-weights hybrid convolution of a
CNN, and the LLM package (prefill + decode, float and each weight mode).

**What each row says.** The same file runs in x86 onert and in arm64 onert (one worker,
:class:`circle_fx.circle.arm64.Arm64Runtime`) on the same inputs: max |arm64 - x86|; max |arm64 - eager|
and max |x86 - eager| relative to max |eager| (eager = the float model: for a quantized file this is its
quantization error); top-1 (argmax over the last dim) agreement arm64 vs x86 and vs eager. A package row
generates greedily on both: its logits over the prefill and every decode step, and whether the tokens agree.
*worse* marks a row whose arm64 error exceeds x86's beyond rounding (:func:`verdict`).

**Coverage, proved per run** (:func:`coverage`): the corpus' op forms are those of every scanned
family's float file and of every row's file (the weight modes, PT2E, the packages' ``model.circle``
with its IF dispatch, every subgraph read); the rows that ran on arm64 must hold each of them, and
the table names any that they do not. Quantized forms come from the weight-mode rows (the weight
modes rewrite only the weight-bearing ops, FC / GATHER / CONV, of the :data:`WEIGHT_FAMILIES`, the
CNN and the package), not from a quantized export of every family: a stated subset.
Each row runs in its own forked process (the machinery of ``scripts/model_support.py``).
"""
from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import model_support as ms  # noqa: E402

COVER = os.path.join(ROOT, "docs", "arm64-cover.json")
BASE = os.path.join(ROOT, "docs", "arm64-support")
MODES = ("int8-weights", "q8_0", "q4_0", "q4_0-mix")
#: decoders every weight mode runs on: a Llama (RMS_NORM, ROPE-free prefill, GQA), Gemma 3 (GELU tanh,
#: sliding window, embedding scale) and a mixture of experts (per-expert linears, TOPK routing)
WEIGHT_FAMILIES = ("llama", "gemma3_text", "mixtral")
CNN = "image-classification/resnet"  # the conv / pool / NHWC CNN the quantized convolution rows use
PACKAGE_MODES = (None, "int8-weights", "q8_0", "q4_0", "q4_0-mix")
TIMEOUT = 300
#: the encoder tasks the cover draws from: those with convolutions / pools / NHWC layouts. The text
#: encoders (masked-lm, seq2seq) are transformer blocks whose forms the decoders' cover holds
ENCODER_TASKS = ("image-classification", "semantic-segmentation", "object-detection", "audio-classification", "ctc")


@dataclass(frozen=True)
class Row:
    """``model_type`` is the row key (what ms.run_all and its cache key on)."""
    model_type: str
    model_class: str = ""
    skip: str | None = None


# ---------------------------------------------------------------------------- op forms
#: ops whose input count is the model's, not the kernel's (IF: one input per state tensor): their form is
#: the distinct input types
VARIADIC = ("CONCATENATION", "PACK", "ADD_N", "CUSTOM", "IF", "WHILE", "CALL")


def op_form(name: str, types: list[str]) -> str:
    """``NAME(type,...)``; a variadic op's distinct input types then ``...`` (a 64-way CONCATENATION
    is the kernel of a 2-way one)."""
    if name in VARIADIC:
        types = [*dict.fromkeys(types), "..."]
    return f"{name}({','.join(types)})"


def normal_form(form: str) -> str:
    """:func:`op_form` of a form string (a cache written before variadic ops were collapsed)."""
    name, _, rest = form.partition("(")
    types = [t for t in rest[:-1].split(",") if t != "..."] if rest[:-1] else []
    return op_form(name, types)


def op_forms(data: bytes) -> list[str]:
    """The file's distinct operator forms over every subgraph (an LLM package's ``model.circle``:
    the IF dispatch, prefill and decode): :func:`op_form` of each operator's input tensors' types,
    ``/pc`` for per-channel quantized (``FULLY_CONNECTED(FLOAT32,INT8,FLOAT32)`` is the hybrid
    kernel, ``FULLY_CONNECTED(FLOAT32,GGML_Q4_0,...)`` the GGML one)."""
    from circle_fx.circle.reader import read_circle

    forms, k, n = set(), 0, 1
    while k < n:
        cf = read_circle(data, subgraph=k)
        n, k = cf.num_subgraphs, k + 1
        for op in cf.operators:
            types = []
            for i in op.inputs:
                if i < 0:
                    types.append("-")
                    continue
                t = cf.tensors[i]
                q = t.quantization
                types.append(t.type_name + ("/pc" if q is not None and getattr(q, "per_channel", False) else ""))
            forms.add(op_form(op.name, types))
    return sorted(forms)


@functools.lru_cache(maxsize=1)
def families() -> dict:
    """Every decoder and encoder family by row key (enumerated once, in the parent: the forked rows inherit it)."""
    import encoder_families as ef
    import hf_families as hf

    return {f.model_type: f for f in [*hf.enumerate_families(), *ef.enumerate_families()]}


def _build(name: str):
    """(model, args, kwargs, eager outputs as numpy) of a decoder (``llama``) or encoder (``task/type``) family."""
    import torch

    import encoder_families as ef
    import hf_families as hf

    fam = families()[name]
    if "/" in name:
        model, _, args, kwargs, ref = ef.build(fam)
        return model, args, kwargs, [t.detach().numpy() for t in ef.tensors(ref)]
    model = hf.build(fam.model_type, fam.model_class)
    ids = hf.example_inputs(model)
    kwargs = hf.example_kwargs(model)
    with torch.no_grad():
        ref = model(*ids, **kwargs)
    logits = ref.logits if hasattr(ref, "logits") else ref[0]
    return model, ids, kwargs, [logits.detach().numpy()]


def cover_check(row: Row) -> dict:
    import torch

    import circle_fx

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    out = {"family": row.model_type, "class": row.model_class}
    try:
        model, args, kwargs, _ = _build(row.model_type)
        cm = circle_fx.export(model, args, example_kwargs=kwargs, verbose=False)
    except Exception as e:  # noqa: BLE001 - a family that does not export covers nothing
        return {**out, "status": "failed", "reason": f"{type(e).__name__}: {ms._first_line(e)}"}
    return {**out, "status": "ok", "forms": op_forms(cm.to_bytes())}


def greedy_cover(rows: list[dict], first=()) -> list[str]:
    """Families, most new forms first, until every form of ``rows`` is covered (ties: name order).
    ``first``: families the table runs anyway (the weight-mode decoders, the CNN), taken before the rest."""
    left = {r["family"]: set(r["forms"]) for r in rows if r.get("status") == "ok"}
    need = set().union(*left.values()) if left else set()
    chosen = [f for f in first if f in left]
    for f in chosen:
        need -= left.pop(f)
    while need:
        best = max(sorted(left), key=lambda f: len(left[f] & need))
        chosen.append(best)
        need -= left.pop(best)
    return chosen


def run_cover(jobs: int, cache: str | None, kinds=("decoders", "encoders")) -> int:
    import encoder_families as ef
    import hf_families as hf

    ok = lambda base: {r["family"] for r in json.load(open(os.path.join(ROOT, "docs", base))) if r["status"] == "ok"}
    dec = ok("model-support.json")
    enc = {f for f in ok("encoder-support.json") if f.split("/")[0] in ENCODER_TASKS}
    rows = [Row(f.model_type, f.model_class) for f in hf.enumerate_families() if f.model_type in dec]
    rows += [Row(f.model_type, f.model_class) for f in ef.enumerate_families() if f.model_type in enc]
    enc = {r.model_type for r in rows if r.model_type in enc}
    # a spread order (seeded): a run cut short (--render of its cache) has scanned both kinds evenly
    import random

    random.Random(0).shuffle(rows)
    rows = [r for r in rows if ("encoders" if r.model_type in enc else "decoders") in kinds]
    report = lambda r: print(f"{r['family']:44s} {r['status']:7s} {len(r.get('forms', []))}", flush=True)  # noqa: E731
    # --render: the cover of the rows the cache holds (a run cut short: the docs say how many)
    got = ms.gather(rows, jobs, cache, report, check_fn=cover_check, partial=True, timeout=TIMEOUT)
    got = [{**r, "forms": sorted({normal_form(f) for f in r.get("forms", [])})} for r in got]
    result = {}
    for kind, names in (("decoders", dec), ("encoders", enc)):
        part = [r for r in got if r["family"] in names]
        forms = sorted(set().union(*(r.get("forms", []) for r in part)))
        result[kind] = {"families": len(part), "of": len(names), "forms": forms,
                        "cover": greedy_cover(part, (*WEIGHT_FAMILIES, CNN)),
                        "forms_of": {r["family"]: r.get("forms", []) for r in part if r["status"] == "ok"}}
    if os.path.exists(COVER):  # a run of one kind keeps the other's result
        result = {**json.load(open(COVER)), **{k: v for k, v in result.items() if k in kinds}}
    with open(COVER, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    for kind, v in result.items():
        print(f"{kind}: {len(v['forms'])} forms over {v['families']} families, covered by {len(v['cover'])}: {v['cover']}")
    return 0


# ------------------------------------------------------------------------------ table
def _runtime():
    from circle_fx.circle.arm64 import Arm64Runtime

    return Arm64Runtime()


def compare(arm, x86, eager) -> dict:
    """The row's numbers for outputs ``arm`` / ``x86`` (lists of arrays; x86 None: it cannot run here)
    and ``eager`` (None: not compared)."""
    import numpy as np

    a = arm[0].astype(np.float64)
    out = {}
    if x86 is not None:
        out["arm_x86"] = max(float(np.abs(p.astype(np.float64) - q).max()) for p, q in zip(arm, x86) if p.size)
        x = x86[0].astype(np.float64)
        if a.ndim and a.shape[-1] > 1:
            out["top1_arm_x86"] = float((a.argmax(-1) == x.argmax(-1)).mean())
    if eager is not None:
        e = eager[0].astype(np.float64)
        scale = float(np.abs(e).max()) or 1.0
        out["arm_eager"] = float(np.abs(a - e).max()) / scale
        if a.ndim and a.shape[-1] > 1:
            out["top1_arm_eager"] = float((a.argmax(-1) == e.argmax(-1)).mean())
        if x86 is not None:
            out["x86_eager"] = float(np.abs(x - e).max()) / scale
            if a.ndim and a.shape[-1] > 1:
                out["top1_x86_eager"] = float((x.argmax(-1) == e.argmax(-1)).mean())
    return out


#: the x86 numbers a row's x86 side cannot measure on this host (GGML files without AVX-512) come
#: from the last table that measured them: these keys of its row, kept as ``x86_prior``
PRIOR_KEYS = ("arm_x86", "x86_eager", "top1_arm_x86", "top1_x86_eager", "tokens_x86", "measured_on")


@functools.lru_cache(maxsize=1)
def _priors() -> dict:
    """Each row's x86 numbers in the committed docs/arm64-support.json (its own, or the prior it carried)."""
    if not os.path.exists(BASE + ".json"):
        return {}
    out = {}
    for r in json.load(open(BASE + ".json")):
        prior = r.get("x86_prior") or ({k: r[k] for k in PRIOR_KEYS if k in r} if "x86_eager" in r else None)
        if prior:
            out[r["family"]] = {"measured_on": "an AVX-512 host, docs/arm64-support.json of 2026-12-06", **prior}
    return out


def x86_missing() -> str | None:
    """Why x86 onert cannot run GGML files here (None: it can)."""
    from circle_fx.circle.ggml_support import ggml_unsupported_reason

    return ggml_unsupported_reason()


def _no_x86(row: dict, key: str, why: str) -> dict:
    row["x86_missing"] = why
    prior = _priors().get(key)
    if prior:
        row["x86_prior"] = prior
    return row


def verdict(r: dict) -> str:
    """``same`` when arm64 = x86 to float32 rounding of the outputs' scale, ``ok`` when arm64 differs from
    x86 but is not further from eager (within 10 % + rounding), else ``worse``. A row whose x86 side cannot
    run here (GGML without AVX-512) is judged against its prior x86 numbers: ``ok*`` / ``worse*``, or
    ``arm-only`` without them."""
    if "arm_x86" not in r and "x86_missing" not in r:
        return r.get("status", "?")
    scale = r.get("scale") or 1.0
    if "x86_missing" in r:
        p = r.get("x86_prior")
        if not p or "x86_eager" not in p:
            return "arm-only"
        good = r["arm_eager"] <= 1.1 * p["x86_eager"] + 1e-5 and r.get("top1_arm_eager", 1) >= \
            p.get("top1_x86_eager", 1) and r.get("tokens_arm", p.get("tokens_x86")) == p.get("tokens_x86")
        return "ok*" if good else "worse*"
    if r["arm_x86"] <= 1e-5 * max(scale, 1.0) and r.get("tokens_agree", True):
        return "same"
    if "arm_eager" in r and r["arm_eager"] <= 1.1 * r["x86_eager"] + 1e-5 and r.get("top1_arm_eager", 1) >= \
            r.get("top1_x86_eager", 1) and r.get("tokens_agree", True):
        return "ok"
    return "worse"


def _file_row(name: str, mode: str | None) -> dict:
    """One exported file: ``mode`` None (float), a weight mode, ``pt2e`` (uint8) or ``int8-weights`` on a CNN."""
    import numpy as np
    import torch

    import circle_fx

    model, args, kwargs, eager = _build(name)
    inputs = [*args, *(v for v in kwargs.values() if isinstance(v, torch.Tensor))]
    if mode == "pt2e":
        from circle_fx.quant.static_flow import quantize_static

        class Plain(torch.nn.Module):  # one tensor out: what PT2E and torch.export see
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *a):
                out = self.m(*a, **kwargs)
                return out.logits if hasattr(out, "logits") else out[0]

        gen = torch.Generator().manual_seed(1)
        calib = [tuple(torch.randint(0, 256, a.shape, generator=gen) if not a.is_floating_point()
                       else torch.randn(a.shape, generator=gen) for a in args) for _ in range(4)] + [tuple(args)]
        q, _ = quantize_static(Plain(model), tuple(args), calibration=calib)
        cm = circle_fx.export(q, tuple(args), quant_target="onert", verbose=False)
        inputs = list(args)
    else:
        cm = circle_fx.export(model, args, example_kwargs=kwargs, quantize=mode, verbose=False)
    forms = op_forms(cm.to_bytes())
    why = x86_missing() if any("GGML" in f for f in forms) else None
    x86 = None if why else cm.run(*inputs)
    with _runtime() as arm:
        a = cm.run(*inputs, runtime=arm)
    row = compare(a, x86, eager)
    row["scale"] = float(np.abs(eager[0]).max())
    row["forms"] = forms
    return _no_x86(row, f"{name}:{mode or 'float'}", why) if why else row


def _package_row(mode: str | None, new: int = 4) -> dict:
    """An LLM package (prefill + decode) of the tiny Llama, greedy on x86 and on arm64 and in transformers."""
    import tempfile

    import numpy as np

    import circle_fx
    import greedy_reference as gr
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import llm_models

    model = llm_models.tiny("llama")
    model.config.use_cache = model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=8, tokenizer=None, quantize=mode)
    pkg_dir = pkg.save(tempfile.mkdtemp(prefix="circle_fx_arm64_pkg_"))
    prompt = [5, 17, 9, 33, 42]
    want, scores = gr.hf_greedy(model, prompt, new)
    row = {}
    from circle_fx.llm import manifest as mf

    files = mf.model_files(pkg.manifest)  # the v2 package: ["model.circle"] (an IF dispatch)
    forms = sorted({f for name in files for f in op_forms(open(os.path.join(pkg_dir, name), "rb").read())})
    why = x86_missing() if any("GGML" in f for f in forms) else None
    with _runtime() as arm:
        runs = {}
        sides = (("arm", lambda: pkg.runner(runtime=arm)),) + (() if why else (("x86", pkg.runner),))
        for where, make in sides:
            runner = make()
            for use_prefill in (True, False):
                runs[where, use_prefill] = runner.generate(prompt, new, eos_token_ids=[], return_logits=True,
                                                           use_prefill=use_prefill)
    a = [np.stack(runs["arm", p][1]) for p in (True, False)]
    x = None if why else [np.concatenate([np.stack(runs["x86", p][1]) for p in (True, False)])]
    e = np.stack(scores)
    row.update(compare([np.concatenate(a)], x, [np.concatenate([e, e])]))
    row["scale"] = float(np.abs(e).max())
    row["tokens_arm"] = runs["arm", True][0][len(prompt):]
    row["tokens_hf"] = want[len(prompt):]
    if not why:
        row["tokens_x86"] = runs["x86", True][0][len(prompt):]
        row["tokens_agree"] = all(runs["arm", p][0] == runs["x86", p][0] for p in (True, False))
    row["decode_steps_agree_prefill"] = runs["arm", True][0] == runs["arm", False][0]
    if why:
        _no_x86(row, f"pkg:{mode or 'float'}", why)
    row["files"], row["forms"] = files, forms
    return row


def table_check(row: Row) -> dict:
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    key = row.model_type
    out = {"family": key, "class": row.model_class}
    name, _, mode = key.partition(":")
    try:
        if name == "pkg":
            out.update(_package_row(None if mode == "float" else mode))
        else:
            out.update(_file_row(name, None if mode in ("", "float") else mode))
    except Exception as e:  # noqa: BLE001 - the row says why
        import traceback

        return {**out, "status": "failed", "reason": f"{type(e).__name__}: {ms._first_line(e)}",
                "trace": traceback.format_exc()[-2000:]}
    out["status"] = "ok"
    out["verdict"] = verdict(out)
    return out


def table_rows() -> list[Row]:
    cover = json.load(open(COVER)) if os.path.exists(COVER) else {k: {"cover": []} for k in ("decoders", "encoders")}
    rows = [Row(f"{f}:float") for f in cover["decoders"]["cover"]]
    rows += [Row(f"{f}:{m}") for f in WEIGHT_FAMILIES for m in ("float", *MODES) if f"{f}:{m}" not in
             {r.model_type for r in rows}]
    rows += [Row("llama:pt2e"), Row(f"{CNN}:float"), Row(f"{CNN}:pt2e"), Row(f"{CNN}:int8-weights")]
    rows += [Row(f"{f}:float") for f in cover["encoders"]["cover"] if f"{f}:float" not in {r.model_type for r in rows}]
    rows += [Row(f"pkg:{m or 'float'}") for m in PACKAGE_MODES]
    seen, out = set(), []
    for r in rows:
        if r.model_type not in seen:
            seen.add(r.model_type)
            out.append(r)
    return out


def coverage(rows: list[dict], cover: dict) -> dict:
    """The op forms of every x86 file (each scanned family's float file, and every table row's file:
    the weight modes, PT2E, the packages) and those the arm64 rows ran: ``uncovered`` must be empty."""
    corpus = {normal_form(f) for v in cover.values() for f in v["forms"]}
    corpus |= {normal_form(f) for r in rows for f in r.get("forms", []) if isinstance(r.get("forms"), list)}
    ran = {normal_form(f) for r in rows if r.get("status") == "ok" for f in r.get("forms", [])}
    return {"corpus": len(corpus), "ran": len(ran & corpus), "uncovered": sorted(corpus - ran)}


def _g(v, fmt="{:.3g}"):
    return "" if v is None else fmt.format(v)


def markdown(rows: list[dict], cover: dict) -> str:
    lines = ["# Circle files on onert's aarch64 build (qemu-user) beside x86 onert and eager", "",
             "Generated by `scripts/arm64_support.py` (do not edit by hand): onert 0.1.0's "
             "`manylinux_2_28_aarch64` wheel in a Debian arm64 root under `qemu-aarch64-static` "
             "(`circle_fx.circle.arm64`, set up by `scripts/arm64.py setup`), the same files and inputs "
             "as x86 onert. Emulation makes speed meaningless here; the numbers are correctness.", ""]
    for kind, v in cover.items():
        lines.append(f"- **{kind}**: the {len(v['forms'])} op forms of {v['families']} of the {v.get('of', v['families'])} {kind} of "
                     f"docs/{'model' if kind == 'decoders' else 'encoder'}-support that export are covered by "
                     f"{len(v['cover'])} families: {', '.join('`' + c + '`' for c in v['cover'])} (`docs/arm64-cover.json`)"
                     + (" — the scan (a seeded random order) was cut at its time budget: `--cover` with the same "
                        "`--cache` resumes it." if v['families'] < v.get('of', v['families']) else "."))
    cov = coverage(rows, cover)
    lines.append(f"- **coverage**: the x86 corpus (those families' float files + every row below) has {cov['corpus']} "
                 f"op forms (op + input types, `/pc` per-channel; GGML / hybrid int8 / uint8 forms are their "
                 f"types); the arm64 rows ran {cov['ran']} of them. Uncovered: "
                 + (", ".join(f"`{f}`" for f in cov["uncovered"]) if cov["uncovered"] else "none") + ".")
    n = {k: sum(1 for r in rows if r.get("verdict") == k) for k in ("same", "ok", "worse", "ok*", "worse*", "arm-only")}
    missing = next((r["x86_missing"] for r in rows if "x86_missing" in r), None)
    failed = [r["family"] for r in rows if r.get("status") != "ok"]
    lines += ["", f"**{len(rows)} rows: {n['same']} same as x86 (to rounding), {n['ok']} differ from x86 but are no "
              f"further from eager, {n['worse']} worse than x86"
              + (f"; {n['ok*'] + n['worse*'] + n['arm-only']} GGML rows x86 onert cannot run on this host "
                 f"({missing}): arm64 measured now, x86 columns marked * from the last table measured on an "
                 f"AVX-512 host, {n['ok*']} no further from eager than that x86 run (ok*), {n['worse*']} "
                 f"further (worse*), {n['arm-only']} without an x86 number" if missing else "")
              + f"{', failed: ' + ', '.join(failed) if failed else ''}.** "
              "Worse rows are explained in docs/onert-findings.md (aarch64). The rows took "
              f"{sum(r.get('seconds', 0) for r in rows) / 60:.0f} min of one process each (export on x86 included; "
              "`-j2` halves the wall time).", "",
              "Columns: arm-x86 = max |arm64 - x86| (absolute); arm-eager / x86-eager = max |out - eager float| / "
              "max |eager| (a quantized file's own error); top-1 = argmax agreement over the last dim; "
              "scale = max |eager|. Package rows: logits of the prefill and each decode step (greedy, 4 new "
              "tokens, both through the prefill model and through decode steps), tokens = arm64's / x86's / "
              "transformers' new tokens.", "",
              "| file | mode | verdict | arm-x86 | arm-eager | x86-eager | top-1 arm=x86 | top-1 arm=eager | "
              "top-1 x86=eager | scale | tokens (arm / x86 / hf) |", "|" + "---|" * 11]
    for r in rows:
        name, _, mode = r["family"].partition(":")
        if r.get("status") != "ok":
            lines.append(f"| {name} | {mode} | {r.get('status')} | {r.get('reason', '')[:160]} |" + " |" * 7)
            continue
        x, star = r, ""
        if "x86_missing" in r:  # x86 cannot run it here: its numbers from the last table that measured them
            x, star = r.get("x86_prior") or {}, "*"
        toks = ""
        if "tokens_arm" in r:
            toks = f"{r['tokens_arm']} / {x.get('tokens_x86', 'n/a')}{star} / {r['tokens_hf']}"
        lines.append(f"| {name} | {mode} | {r['verdict']} | {_g(x.get('arm_x86'))}{star} | {_g(r.get('arm_eager'))} | "
                     f"{_g(x.get('x86_eager'))}{star} | {_g(x.get('top1_arm_x86'), '{:.3f}')}{star} | "
                     f"{_g(r.get('top1_arm_eager'), '{:.3f}')} | {_g(x.get('top1_x86_eager'), '{:.3f}')}{star} | "
                     f"{_g(r.get('scale'))} | {toks} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import circle_fx  # noqa: F401 - imported once in the parent, every forked row starts with it
    import circle_fx.emit.lowerings  # noqa: F401
    import circle_fx.passes.decompose_unlowered  # noqa: F401

    jobs, cache, given, argv = ms.options(argv, "--cover")
    if "--cover" in given:
        return run_cover(jobs, cache, tuple(argv) or ("decoders", "encoders"))
    from circle_fx.circle.arm64 import Arm64Env

    why = Arm64Env().missing()
    if why:
        print("arm64 unavailable:", why)
        return 1
    rows = table_rows()
    families()
    if argv:
        rows = [r for r in rows if r.model_type in argv] + [Row(a) for a in argv if a not in {r.model_type for r in rows}]

    def report(r):
        print(f"{r['family']:44s} {r.get('verdict', r['status']):6s} {r.get('seconds', ''):>6} "
              f"arm-x86 {_g(r.get('arm_x86'))} arm-eager {_g(r.get('arm_eager'))} x86-eager {_g(r.get('x86_eager'))} "
              f"top1 {_g(r.get('top1_arm_x86'))} {r.get('reason', '')[:120]}", flush=True)

    # --render of a run cut short: the rows the cache holds (coverage names the forms the rest would run)
    got = ms.gather(rows, jobs, cache, report, check_fn=table_check, timeout=TIMEOUT, partial=True)
    if got is None:
        return 1
    ms.publish(got, argv, BASE, lambda rs: markdown(rs, json.load(open(COVER))))
    cov = coverage(got, json.load(open(COVER)))
    print(f"coverage: {cov['ran']} of the corpus' {cov['corpus']} op forms ran on arm64; uncovered: "
          f"{cov['uncovered'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
