"""Generate docs/encoder-support.md: which transformers vision, audio and encoder families circle_fx exports.

    PYTHONPATH=$PWD python scripts/encoder_support.py -j2 --cache=/tmp/enc.jsonl   # every family (resumable)
    ... encoder_support.py --cache=/tmp/enc.jsonl --render                          # docs from the cache
    ... encoder_support.py --cache=/tmp/enc.jsonl --partial                         # docs from what finished
    PYTHONPATH=$PWD python scripts/encoder_support.py image-classification/resnet  # some rows, no table

Rows: every (task, model type) of ``scripts/encoder_families.TASKS``. Each is built tiny
(``encoder_families.build``), exported with circle_fx (default pipeline, unpatched), run in
onert and every output tensor compared with eager; the row counts the TRANSPOSE operators
of the Circle file (the layout pass's goal for a CNN: one at the input, one at the output).
The run machinery (forked child per row, timeout, JSON-lines cache) is ``model_support``'s.
"""
from __future__ import annotations

import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import encoder_families as ef  # noqa: E402
import hf_families as hf  # noqa: E402
import model_support as ms  # noqa: E402

RTOL, ATOL = 1e-4, 1e-4
#: seconds per row: vision families built at their default size (BiT, CvT, EfficientNet,
#: ShieldGemma2) export and run for minutes on a shared two-core machine
TIMEOUT = 480


def check(fam: ef.Family) -> dict:
    """Everything the table says about one row (runs in the child process)."""
    import numpy as np
    import torch

    import circle_fx
    from circle_fx.errors import CircleFxError, UnsupportedOpError

    torch.set_num_threads(1)
    row = {"family": fam.model_type, "class": fam.model_class}
    try:
        model, kind, args, kwargs, ref = ef.build(fam)
    except hf.SkipFamily as e:
        return {**row, "status": "skipped", "reason": str(e)[:400]}
    row["config"] = kind
    expected = [t.detach().numpy() for t in ef.tensors(ref)]
    try:
        cm = circle_fx.export(model, args, example_kwargs=kwargs, verbose=False)
    except UnsupportedOpError as e:
        ops = sorted({op for op, _, _ in e.ops})
        # aten ops without a lowering are listed; a Circle operator the legalization refuses
        # (an int64 GATHER: upper-case name) is explained by the error's own first line
        named = ops and all(not op.isupper() for op in ops)
        return {**row, "status": "unsupported", "reason": ("no lowering for " + ", ".join(ops)) if named
                else ms._first_line(e)[:300], "ops": ops}
    except CircleFxError as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {ms._first_line(e)}{ms._where(e)}"}
    except Exception as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {ms._first_line(e)}",
                "trace": traceback.format_exc()[-2000:]}
    hist = cm.op_histogram()
    row["transposes"] = int(hist.get("TRANSPOSE", 0))
    row["ops"] = int(sum(hist.values()))
    inputs = [*args, *(v for v in kwargs.values() if isinstance(v, torch.Tensor))]
    try:
        outs = cm.run(*inputs)
    except CircleFxError as e:
        return {**row, "status": "runtime", "reason": f"{type(e).__name__}: {ms._first_line(e)}"}
    if len(outs) != len(expected):
        expected = expected[:1]
        outs = outs[:1]
        row["note"] = "first output compared (output counts differ)"
    diff = 0.0
    for o, e in zip(outs, expected):
        if o.shape != e.shape:
            return {**row, "status": "mismatch", "reason": f"shape {o.shape} != eager {e.shape}"}
        if o.size:
            diff = max(diff, float(np.abs(o.astype(np.float64) - e.astype(np.float64)).max()))
        if not np.allclose(o, e, rtol=RTOL, atol=ATOL):
            row["status"] = "mismatch"
    row["max_diff"] = diff
    row["compared"] = len(outs)
    if row.get("status") == "mismatch":
        row["reason"] = f"max abs diff {diff:.3g} exceeds rtol={RTOL}, atol={ATOL}" + _float64_note(model, args, kwargs, outs, expected)
    else:
        row["status"] = "ok"
    return row


def _float64_note(model, args, kwargs, outs, expected) -> str:
    """Whether a mismatch is float32 rounding: both eager float32 and onert against eager in
    float64 (a model with outputs in the thousands loses more than the tolerance in float32)."""
    import numpy as np
    import torch

    picks = _TopkSpy()
    try:
        with torch.no_grad(), picks:
            ref = model.double()(*[a.double() if a.is_floating_point() else a for a in args], **kwargs)
        model.float()
        exact = [t.detach().numpy() for t in ef.tensors(ref)][:len(outs)]
        eager = max(float(np.abs(e - x).max()) for e, x in zip(expected, exact) if e.size)
        onert = max(float(np.abs(o - x).max()) for o, x in zip(outs, exact) if o.size)
        scale = max(float(np.abs(x).max()) for x in exact if x.size)
    except Exception as e:  # noqa: BLE001 - the note is optional
        return f" (no float64 run: {type(e).__name__})"
    note = f"; against eager in float64 (outputs up to {scale:.3g}): onert {onert:.2g}, eager float32 {eager:.2g}"
    if picks.gap is not None:
        note += (f"; its top-k selection is not determined in float32: the k-th and (k+1)-th scores differ by "
                 f"{picks.gap:.2g} in float64")
    return note


class _TopkSpy:
    """Records, while active, the smallest float64 gap between the k-th and (k+1)-th largest
    value over every ``torch.topk`` the model calls (RT-DETR-style detectors pick their queries
    among the encoder's anchors by score). A gap far below float32's resolution means the
    selection, and every output after it, is decided by rounding."""

    def __init__(self):
        self.gap = None

    def __enter__(self):
        import torch

        self.topk = torch.topk

        def spy(x, k, dim=-1, largest=True, sorted=True, **kw):
            out = self.topk(x, k, dim, largest, sorted, **kw)
            if x.dtype == torch.float64 and x.shape[dim] > k:
                ranked = torch.sort(x, dim=dim, descending=largest).values
                edge = (ranked.narrow(dim, k - 1, 1) - ranked.narrow(dim, k, 1)).abs()
                gap = float(edge.min())
                self.gap = gap if self.gap is None else min(self.gap, gap)
            return out

        torch.topk = spy
        return self

    def __exit__(self, *exc):
        import torch

        torch.topk = self.topk
        if self.gap is not None and self.gap > 1e-5:
            self.gap = None  # resolved in float32: not the cause
        return False


def markdown(rows: list[dict], total: int | None = None) -> str:
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    ok = [r for r in rows if r["status"] == "ok"]
    tried = [r for r in rows if r["status"] != "skipped"]
    total = total or len(rows)
    lines = [
        "# Model support: transformers vision, audio and encoder families",
        "",
        "Generated by `scripts/encoder_support.py` (do not edit by hand). One row per model type of",
        "transformers' image-classification, semantic-segmentation, object-detection, audio-classification,",
        "CTC, masked-LM and seq2seq-LM auto mappings (`scripts/encoder_families.py`), built from a tiny",
        "random config (the decoder table's sizes plus small image / audio / stage sizes; when the tiny",
        "config does not build or run, the family's default config with two layers, column *config*),",
        "exported unpatched with `circle_fx.export`, run in onert 0.1.0 and every output compared",
        f"with eager (`rtol={RTOL}, atol={ATOL}`). *TRANSPOSE* counts the layout operators left in the",
        "Circle file (a CNN's goal: 1 at the input, 1 at the output).",
        "",
        f"**{len(ok)} of {len(tried)} rows built export and match eager; {len(rows) - len(tried)} skipped"
        + (f"; {len(rows)} of {total} rows run so far (the rest are missing from this table)." if len(rows) < total
           else ".") + "**",
        "",
        "| task / family | class | config | exported | TRANSPOSE | max abs diff | reason / note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = f"{r['max_diff']:.2g}" if "max_diff" in r else ""
        note = r.get("reason", "") or r.get("note", "")
        lines.append("| " + " | ".join(cell(c) for c in (
            r["family"], r["class"], r.get("config", ""), ms.STATUS.get(r["status"], r["status"]),
            r.get("transposes", ""), diff, note)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import circle_fx  # noqa: F401
    import circle_fx.emit.lowerings  # noqa: F401
    import circle_fx.passes.decompose_unlowered  # noqa: F401

    jobs, cache, given, argv = ms.options(argv, "--partial")  # --partial: the rows the cache holds
    partial = "--partial" in given
    jobs = 0 if partial else jobs
    all_fams = ef.enumerate_families()
    fams = [f for f in all_fams if f.model_type in argv] if argv else list(all_fams)

    def report(row):
        print(f"{row['family']:44s} {row['status']:11s} {row.get('seconds', ''):>6} "
              f"{row.get('transposes', '')!s:>3} {row.get('reason', '')[:140]}", flush=True)

    rows = ms.gather(fams, jobs, cache, report, check_fn=check, partial=partial, timeout=TIMEOUT)
    if rows is None:
        return 1
    ms.publish(rows, argv, os.path.join(ROOT, "docs", "encoder-support"),
               lambda rs: markdown(rs, total=len(all_fams)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
