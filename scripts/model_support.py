"""Generate docs/model-support.md: which transformers causal-LM families circle_fx exports.

    PYTHONPATH=$PWD python scripts/model_support.py -j2        # every family, 2 at a time (~30 min)
    ... model_support.py -j2 --cache=/tmp/rows.jsonl [--reverse]  # resumable; two runs can share it
    ... model_support.py --cache=/tmp/rows.jsonl --render       # write the docs from the cache
    PYTHONPATH=$PWD python scripts/model_support.py llama lfm2 # some families, table not written

For each family of ``scripts/hf_families.py`` (all of transformers' causal-LM auto mapping):
build the tiny random model, count the RMSNorm modules it *executes* (forward hooks), export
it with circle_fx (default pipeline, unpatched), run the Circle file in onert and compare the
logits with eager. Each family runs in its own forked process with a timeout, so a crash or
a hang in one family cannot stop the table. The results also go to docs/model-support.json,
which the slow test tests/e2e/test_hf_families.py reads to know which families must keep working.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.connection
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import hf_families as hf  # noqa: E402

TIMEOUT = 150  # seconds per family (export + onert run of a 2-layer model takes ~2-10 s)
RTOL, ATOL = 1e-4, 1e-4


def check(fam: hf.HfFamily) -> dict:
    """Everything the table says about one family (runs in the child process)."""
    import numpy as np
    import torch

    import circle_fx
    from circle_fx.errors import CircleFxError, UnsupportedOpError

    torch.set_num_threads(1)
    row = {"family": fam.model_type, "class": fam.model_class}
    try:
        model = hf.build(fam.model_type, fam.model_class)
    except hf.SkipFamily as e:
        return {**row, "status": "skipped", "reason": str(e)}
    except Exception as e:
        return {**row, "status": "skipped", "reason": f"tiny config does not build: {type(e).__name__}: "
                                                      f"{_first_line(e)}"}
    ids = hf.example_inputs(model)
    try:
        ref, norms = hf.eager_with_norm_calls(model, ids)
    except Exception as e:
        return {**row, "status": "skipped", "reason": f"eager forward fails: {type(e).__name__}: {_first_line(e)}"}
    row["rms_modules"] = norms
    if norms == 0:
        row["scope"] = "no RMSNorm"
    try:
        cm = circle_fx.export(model, ids, example_kwargs=hf.example_kwargs(model), verbose=False)
    except UnsupportedOpError as e:
        ops = sorted({op for op, _, _ in e.ops})
        return {**row, "status": "unsupported", "reason": ("no lowering for " + ", ".join(ops)) if ops
                else _first_line(e), "ops": ops}
    except CircleFxError as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {_first_line(e)}{_where(e)}"}
    except Exception as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {_first_line(e)}",
                "trace": traceback.format_exc()[-2000:]}
    row["rms_fused"] = int(cm.op_histogram()["RMS_NORM"])
    try:
        circle_fx.verify(cm)
        out = cm.run(*ids)[0]
    except CircleFxError as e:
        return {**row, "status": "runtime", "reason": f"{type(e).__name__}: {_first_line(e)}"}
    expected = ref.detach().numpy()
    if out.shape != expected.shape:
        return {**row, "status": "mismatch", "reason": f"shape {out.shape} != eager {expected.shape}"}
    diff = float(np.abs(out - expected).max())
    row["max_diff"] = diff
    ok = bool(np.allclose(out, expected, rtol=RTOL, atol=ATOL))
    row["status"] = "ok" if ok else "mismatch"
    if not ok:
        row["reason"] = f"max abs diff {diff:.3g} exceeds rtol={RTOL}, atol={ATOL}"
    return row


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:300]


def _where(e: BaseException) -> str:
    """The model source line circle_fx's error names (``  at File ".../modeling_x.py", line N,
    in f: code``), shortened to ``(at modeling_x.py:N: code)``, so a capture failure says where."""
    import re

    for line in str(e).splitlines():
        m = re.match(r'\s*at File "(?:.*/)?([^"/]+)", line (\d+), in [^\s:]+(?:: (.*))?', line)
        if m:
            code = f": `{m.group(3).strip()[:120]}`" if m.group(3) else ""
            return f" (at {m.group(1)}:{m.group(2)}{code})"
    return ""


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when the runner dies, so no orphan keeps running."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _child(fam, conn, check_fn):
    _die_with_parent()
    try:
        conn.send(check_fn(fam))
    except BaseException as e:  # noqa: BLE001 - report anything, the parent keeps going
        conn.send({"family": fam.model_type, "class": fam.model_class, "status": "failed",
                   "reason": f"{type(e).__name__}: {_first_line(e)}"})


def _start(fam: hf.HfFamily, check_fn):
    ctx = mp.get_context("fork")  # torch/transformers/circle_fx are imported once, in the parent
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(fam, child, check_fn))
    p.start()
    child.close()
    return p, parent, time.time()


def _cached(path: str | None) -> dict[str, dict]:
    if not path or not os.path.exists(path):
        return {}
    with open(path) as fh:
        return {r["family"]: r for r in map(json.loads, filter(str.strip, fh))}


def options(argv: list[str], *flags: str) -> tuple[int, str | None, set[str], list[str]]:
    """The table scripts' shared command line: ``-jN`` (jobs), ``--cache=FILE``, ``--render``
    (jobs 0: the docs from the cache alone) and the script's own boolean ``flags``, before the
    family names. Returns (jobs, cache, the flags given, the names); an unknown option exits."""
    jobs, cache, given = 1, None, set()
    while argv and argv[0].startswith("-"):
        opt, argv = argv[0], argv[1:]
        if opt.startswith("-j"):
            jobs = int(opt[2:])
        elif opt.startswith("--cache="):
            cache = opt.split("=", 1)[1]
        elif opt == "--render":
            jobs = 0
        elif opt in flags:
            given.add(opt)
        else:
            raise SystemExit(f"unknown option {opt!r}: -jN, --cache=FILE, --render{''.join(', ' + f for f in flags)}")
    return jobs, cache, given, argv


def gather(fams: list[hf.HfFamily], jobs: int, cache: str | None, report, check_fn=None,
           partial: bool = False, timeout: float = TIMEOUT) -> list[dict] | None:
    """The rows of ``fams``: read from ``cache`` alone when ``jobs == 0`` (``--render``; None,
    after naming the families it lacks, when it does not hold them all; with ``partial``, the
    rows it holds: a run cut short), else :func:`run_all`."""
    if jobs:
        return run_all(fams, jobs, timeout, report=report, cache=cache, check_fn=check_fn)
    known = _cached(cache)
    missing = [f.model_type for f in fams if f.model_type not in known]
    if missing and not partial:
        print(f"not in {cache}: {missing}")
        return None
    return [known[f.model_type] for f in fams if f.model_type in known]


def publish(rows: list[dict], argv: list[str], base: str, markdown) -> None:
    """A run over every family (no ``argv``) writes ``base.md`` (``markdown(rows)``) and
    ``base.json`` (rows without their traces); a run over named families prints the traces."""
    if argv:
        for r in rows:
            if "trace" in r:
                print(r["family"], r["trace"])
        return
    with open(base + ".md", "w") as fh:
        fh.write(markdown(rows))
    with open(base + ".json", "w") as fh:
        json.dump([{k: v for k, v in r.items() if k != "trace"} for r in rows], fh, indent=1)
        fh.write("\n")


def run_all(fams: list[hf.HfFamily], jobs: int = 1, timeout: float = TIMEOUT, report=print,
            cache: str | None = None, check_fn=None) -> list[dict]:
    """Each family in its own forked process, ``jobs`` at a time; a crash or a timeout
    becomes that family's row. With ``cache`` (a JSON-lines file), rows already there are
    reused and new rows are appended as they finish, so runs can resume or share work.
    ``check_fn(family) -> row`` is what runs in the child (default :func:`check`; the
    generation table, ``scripts/generation_support.py``, passes its own)."""
    check_fn = check_fn or check
    rows: dict[str, dict] = {}
    pending = list(fams)
    running: dict = {}  # connection -> (family, process, start)

    def done(row):
        rows[row["family"]] = row
        report(row)
        if cache:
            with open(cache, "a") as fh:
                fh.write(json.dumps({k: v for k, v in row.items() if k != "trace"}) + "\n")

    while pending or running:
        while pending and len(running) < jobs:
            fam = pending.pop(0)
            known = _cached(cache).get(fam.model_type)
            if known is not None:
                rows[fam.model_type] = known
                continue
            if fam.skip:
                done({"family": fam.model_type, "class": fam.model_class, "status": "skipped", "reason": fam.skip})
                continue
            p, conn, t0 = _start(fam, check_fn)
            running[conn] = (fam, p, t0)
        for conn in mp.connection.wait(list(running), timeout=1.0):
            fam, p, t0 = running.pop(conn)
            try:
                row = conn.recv()
            except EOFError:
                row = {"family": fam.model_type, "class": fam.model_class, "status": "failed",
                       "reason": f"crashed (exit code {p.join(5) or p.exitcode})"}
            p.join(5)
            if p.is_alive():
                p.kill()
            row["seconds"] = round(time.time() - t0, 1)
            done(row)
        for conn, (fam, p, t0) in list(running.items()):
            if time.time() - t0 > timeout:
                p.kill()
                p.join()
                running.pop(conn)
                done({"family": fam.model_type, "class": fam.model_class, "status": "failed",
                      "reason": f"timed out after {timeout:.0f} s", "seconds": round(timeout)})
    return [rows[f.model_type] for f in fams]


STATUS = {"ok": "yes", "mismatch": "yes, WRONG", "runtime": "yes, onert fails", "unsupported": "no",
          "failed": "no", "skipped": "skipped"}


def markdown(rows: list[dict]) -> str:
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    ok = [r for r in rows if r["status"] == "ok"]
    rms_ok = [r for r in ok if r.get("rms_modules")]
    tried = [r for r in rows if r["status"] != "skipped"]
    lines = [
        "# Model support: transformers causal-LM families",
        "",
        "Generated by `scripts/model_support.py` (do not edit by hand). Every model type of",
        "`transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` is built from a",
        "tiny random config (`scripts/hf_families.py`: the family's defaults with sizes shrunk, one",
        "layer of each layer kind; norm scales perturbed, constant weight matrices such as zero-initialised",
        "router gates made random so no top-k hinges on ties, a default init scale above 0.1 capped at 0.02:",
        "CPM-Ant's `init_std=1.0` made the tiny model ill-conditioned), exported unpatched with `circle_fx.export(model, (input_ids,),",
        "example_kwargs={'use_cache': False})`, run in onert 0.1.0 and compared with eager",
        f"(`rtol={RTOL}, atol={ATOL}`).",
        "",
        f"**{len(ok)} of {len(tried)} families built as text decoders export and match eager "
        f"({len(rms_ok)} of them with RMSNorm); {len(rows) - len(tried)} skipped.**",
        "",
        "Columns: *RMSNorm calls* = RMSNorm modules the eager forward executes (forward hooks on",
        "classes named `...RMSNorm...` or `T5LayerNorm`; a norm module that runs another one, such as",
        "AXK2's `GatedRMSNorm` wrapping its `RMSNorm`, counts once); *RMS_NORM ops* = fused operators in the",
        "Circle file. They are equal when every norm fused.",
        "",
        "## How ops without a Circle lowering are handled",
        "",
        "1. **Complex arithmetic** (`view_as_complex` / `view_as_real`, Llama4's rotary embedding):",
        "   `passes/complex_to_real.py` rewrites complex values into (real, imaginary) pairs of",
        "   float tensors.",
        "2. **General fallback** (`passes/decompose_unlowered.py`, inside the `decompose` pass): every",
        "   op with no lowering that depends on a model input is decomposed with, in order,",
        "   circle_fx's own table (`passes/decompositions.py`), torch's core ATen decompositions, torch's",
        "   full decomposition table, or the op's CompositeImplicitAutograd body, traced with `make_fx`",
        "   on the node's shapes. The result replaces the op only if every op in it lowers; otherwise",
        "   the error still names the original op. This handles `stack`, `masked_fill`, `tril`",
        "   / `triu`, `softplus`, `einsum`, `multiply` / `subtract` aliases, `min.other`, `layer_norm`,",
        "   `slice_scatter`, `new_empty` + `copy_`, `zeros_like` ... through torch's tables, and",
        "   through circle_fx's own table: `gather` / `scatter` (one-hot compare + select + sum: onert",
        "   0.1.0 has no GATHER_ND / SCATTER_ND), `full_like` / `*_like` / `new_*` (constants),",
        "   `copy`, `expm1` (`exp - 1`), `log1p`, `var_mean` / `var`, `flip` (GATHER), `repeat` (CONCATENATION), 1-D",
        "   `convolution` (`conv1d`, any groups: shifted slices, FULLY_CONNECTED / MUL / BATCH_MATMUL per tap),",
        "   `linalg_vector_norm`, `unfold` (one GATHER), `gather` from a single row (one GATHER).",
        "   `REFUSED_FORMS` in the same file decomposes the forms a lowering exists for but onert 0.1.0",
        "   cannot run: softmax off the last axis, an int64 sum of bools (int32 SUM, exact), integer",
        "   `&` / `|` of 0/1 flags (logical ops), negative pads.",
        "3. **New lowerings**: `constant_pad_nd` -> PAD / PADV2 (`emit/lowerings/pad.py`); integer / bool",
        "   `where` without SELECT_V2 (onert's runs float only); constant `unbind` / `split` fold per result.",
        "4. **Norm spellings** (`fusions/_rms_norm_spellings.py`, the RMSNorm family's canonical rules): `mean(-1)[..., None]`, `vector_norm * D**-0.5`...",
        "   are brought to the form the RMSNorm fusion matches.",
        "5. **onert's limits** (`circle/op_table.py` and `circle/limits.py`, measured in `docs/onert-findings.md`): BATCH_MATMUL and",
        "   reductions run at rank <= 4, comparisons and broadcasting SELECT_V2 are silently wrong above",
        "   rank 4. `emit/legalize/ranks.py` folds matmul batch dims and BROADCAST_TO after lowering, reductions",
        "   and slices fold their dims, and `emit/legalize/ranks.py` folds every elementwise op after lowering",
        "   (linear-attention and Mamba-2 chunked scans are 5-D); what cannot fold is an export error.",
        "   A constant matmul LHS (refused by onert) becomes `(B^T @ A^T)^T` (`emit/legalize/forms.py`). Element types: an",
        "   operator onert runs on fewer types (bool / integer STRIDED_SLICE, SPLIT, BROADCAST_TO, GATHER,",
        "   PAD ...) gets its operands CAST to a type it runs, exactly, after lowering (`emit/legalize/types.py`,",
        "   the op table's `types`); what cannot be made exact is an export error.",
        "",
        "Families that do not export are listed below with the reason. Most fail inside `torch.export`",
        "itself: their forward branches on tensor *values* (`nonzero()` loops over the experts hit,",
        "`.item()`, `.tolist()` split sizes), which no static graph captures; circle_fx does not patch",
        "models, and transformers offers no export-friendly implementation for these modules (the",
        "default MoE experts of the other families are switched, see the README). The row names the",
        "model line.",
        "",
        "| family | class | exported | RMSNorm calls | RMS_NORM ops | max abs diff | reason / note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = f"{r['max_diff']:.2g}" if "max_diff" in r else ""
        note = r.get("reason", "")
        if r["status"] == "ok" and r.get("rms_modules", 0) != r.get("rms_fused", 0):
            note = (note + " " if note else "") + "not every RMSNorm fused"
        if r.get("scope") and not note:
            note = r["scope"]
        lines.append("| " + " | ".join(cell(c) for c in (
            r["family"], r["class"], STATUS.get(r["status"], r["status"]), r.get("rms_modules", ""),
            r.get("rms_fused", ""), diff, note)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    # import once in the parent: every forked child starts with circle_fx and its passes loaded
    import circle_fx  # noqa: F401
    import circle_fx.emit.lowerings  # noqa: F401
    import circle_fx.passes.complex_to_real  # noqa: F401
    import circle_fx.passes.decompose_unlowered  # noqa: F401

    jobs, cache, given, argv = options(argv, "--reverse")  # --render: docs from --cache (every family there)
    reverse = "--reverse" in given
    all_fams = hf.enumerate_families()
    fams = [f for f in all_fams if f.model_type in argv] if argv else list(all_fams)
    if reverse:
        fams.reverse()

    def report(row):
        print(f"{row['family']:28s} {row['status']:11s} {row.get('seconds', ''):>6} "
              f"{row.get('rms_modules', '')!s:>3} {row.get('rms_fused', '')!s:>3} {row.get('reason', '')[:150]}",
              flush=True)

    rows = gather(fams, jobs, cache, report)
    if rows is None:
        return 1
    if reverse:
        rows.reverse()
    publish(rows, argv, os.path.join(ROOT, "docs", "model-support"), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
