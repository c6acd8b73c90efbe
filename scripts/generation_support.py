"""Generate docs/generation-support.md: which transformers causal-LM families *generate* exactly.

    nice PYTHONPATH=$PWD python scripts/generation_support.py -j2 --cache=/tmp/gen.jsonl  # every family
    ... generation_support.py --cache=/tmp/gen.jsonl --render    # write the docs from the cache
    PYTHONPATH=$PWD python scripts/generation_support.py llama lfm2  # some families, table not written

The families and their tiny random models are those of ``docs/model-support.md``
(``scripts/hf_families.py``: every model type of transformers' causal-LM auto mapping). For
each family that ``circle_fx.export`` runs (its row in ``docs/model-support.json`` is ``ok``):
``circle_fx.export_llm(model, max_seq_len=MAX_SEQ_LEN, prefill_len=PREFILL_LEN)``, then
``LLMRunner.generate`` in onert against ``model.generate(do_sample=False)`` in transformers:

- two prompts, one shorter than ``prefill_len`` (right-padded in the prefill model) and one
  longer (its tail goes through decode steps), each run through the prefill model and through
  decode steps only; :data:`NEW_TOKENS` greedy tokens with no EOS, compared token for token
  (the logits each token was picked from are compared too: the largest difference is reported,
  and above :data:`LOGIT_TOL` the family is not "yes" unless transformers fed the prompt as the
  runner feeds it gives the runner's logits: then the reference's own logits depend on the split);
- different tokens that transformers itself generates when fed the prompt as the runner feeds it
  are reported as such (status ``split``), not as wrong;
- EOS: the token transformers generates third becomes the EOS id of both, which must then stop
  at the same place (transformers includes the EOS token in the output; so must the runner);
- the generation config's logits processors (forced EOS / BOS, suppressed or bad words, n-gram
  and repetition penalties) are off in the reference: the runner's greedy applies none, so both
  sides pick the plain argmax (``greedy_reference.py``, the comparison the generation tests make too).

Models are built as decoders (``hf_families.build(decoder=True)``: ``config.is_decoder`` set
where the config has it): BERT-style ``…ForCausalLM`` classes default to ``is_decoder=False``,
a bidirectional mask and no cache, which is no decoder (transformers warns so), and whose
padded prefill then attends to the padding (Megatron-BERT, XLM-RoBERTa-XL mismatched so).

A model with conv / recurrent state (``prefill.pads`` false in its manifest) prefills only a
prompt of at least ``prefill_len`` tokens: its short prompt goes through decode steps both times.

Each family runs in its own forked process with a timeout (``model_support.run_all``), so a
crash or hang in one cannot stop the table. Families whose ``export`` fails are listed with
that reason, not run again. ``docs/generation-support.json`` holds the rows;
``tests/llm/test_generation_support.py`` checks it covers every enumerated family.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import hf_families as hf  # noqa: E402
from greedy_reference import compare, hf_greedy  # noqa: E402
import model_support as ms  # noqa: E402

PREFILL_LEN = 4
NEW_TOKENS = 8
#: the short prompt (padded in the prefill model) and the long one (prefill + decode steps);
#: ids >= 3 avoid the tiny configs' pad / bos / eos ids
PROMPTS = {"short": [5, 17, 9], "long": [5, 17, 9, 33, 42, 100, 7]}
MAX_SEQ_LEN = max(map(len, PROMPTS.values())) + NEW_TOKENS
EXPORT_TABLE = os.path.join(ROOT, "docs", "model-support.json")
#: the table: ``.md`` and ``.json`` beside each other
OUT = os.path.join(ROOT, "docs", "generation-support")


def _export_rows() -> dict[str, dict]:
    with open(EXPORT_TABLE) as fh:
        return {r["family"]: r for r in json.load(fh)}


#: a family whose tokens match but whose logits differ from transformers' by more than this is
#: not "yes" (tokens can match by luck: a wrong position embedding in a tiny random model).
#: Exact families differ by rounding, at most 4e-6 when this was set; RoFormer decoding at
#: position 0 differed by 8e-5 with the same tokens
LOGIT_TOL = 1e-4


def _hf_chunked(model, ids: list[int], first: int):
    """transformers' own greedy tokens and the logits each was picked from when the prompt is
    fed as the runner feeds it: its first ``first`` tokens in one forward, then one token a
    forward, on the model's ``DynamicCache`` ((None, None) when the model takes no such cache).
    A difference where these equal the runner's is the reference depending on how the prompt is
    split (e.g. a cache that keeps a sliding window while the one-forward prompt mask is full),
    not an export error."""
    import torch
    from transformers import DynamicCache

    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cache, seq, seen = DynamicCache(config=model.config), list(ids), []
            chunks = [ids[:first]] + [[t] for t in ids[first:]]
            for _ in range(NEW_TOKENS):
                for chunk in chunks:
                    logits = model(torch.tensor([chunk]), cache=cache, use_cache=True).logits
                seen.append(logits[0, -1].numpy())
                seq.append(int(logits[0, -1].argmax()))
                chunks = [[seq[-1]]]
            return seq, seen
    except Exception:
        return None, None


def _max_diff(a, b) -> float:
    import numpy as np

    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def check(fam: hf.HfFamily) -> dict:
    """Everything the table says about one family (runs in the child process)."""
    import torch

    import circle_fx
    from circle_fx.errors import CircleFxError, InputError, RuntimeFailure

    torch.set_num_threads(1)
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # capture errors are rows
    row = {"family": fam.model_type, "class": fam.model_class}
    try:
        model = hf.build(fam.model_type, fam.model_class, decoder=True)
    except Exception as e:
        return {**row, "status": "skipped", "reason": f"tiny config does not build: {type(e).__name__}: "
                                                      f"{ms._first_line(e)}"}
    model.config.use_cache = True  # hf_families builds for a single forward; generation caches
    model.generation_config.use_cache = True
    kinds = getattr(getattr(model.config, "get_text_config", lambda: model.config)(), "layer_types", None)
    if kinds:
        row["layer_types"] = sorted(set(kinds))
    refs = {}
    try:
        for name, ids in PROMPTS.items():
            refs[name] = hf_greedy(model, ids, NEW_TOKENS)
    except Exception as e:
        return {**row, "status": "no reference", "reason": f"transformers' generate fails: {type(e).__name__}: "
                                                           f"{ms._first_line(e)}"}
    try:
        pkg = circle_fx.export_llm(model, max_seq_len=MAX_SEQ_LEN, prefill_len=PREFILL_LEN, tokenizer=None)
    except InputError as e:
        return {**row, "status": "refused", "reason": f"{type(e).__name__}: {ms._first_line(e)}"}
    except CircleFxError as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {ms._first_line(e)}{ms._where(e)}"}
    except Exception as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__} (not wrapped): {ms._first_line(e)}",
                "trace": traceback.format_exc()[-2000:]}
    diff, split_diff = 0.0, 0.0  # vs model.generate; vs transformers fed as the runner feeds the prompt
    pads = pkg.manifest["prefill"].get("pads", True)
    try:
        with tempfile.TemporaryDirectory() as d:
            pkg.save(d)
            runner = pkg.runner()
            for name, ids in PROMPTS.items():
                for g in compare(runner, model, [ids], NEW_TOKENS, refs=[refs[name]]):
                    got, want, k = g.got, g.want, g.first_difference
                    # the runner's split: prefill (exact-length prompts only without padding), then steps
                    first = min(PREFILL_LEN, len(ids)) if g.use_prefill and (pads or len(ids) >= PREFILL_LEN) else 1
                    if k is not None:
                        how = "prefill" if g.use_prefill else "decode steps"
                        same = _hf_chunked(model, ids, first)[0] == got
                        split = ("; transformers itself generates the runner's tokens when fed the prompt as the runner "
                                 f"does ({first} token(s) in one forward, then one a step): its result depends on how "
                                 "the prompt is split") if same else ""
                        return {**row, "status": "split" if same else "mismatch",
                                "reason": f"{name} prompt through {how}: new token {k} is {got[len(ids) + k]}, "
                                          f"transformers {want[len(ids) + k]}{split}"}
                    diff = max(diff, g.logit_diff)
                    if g.logit_diff > LOGIT_TOL:
                        seq, seen = _hf_chunked(model, ids, first)
                        split_diff = max(split_diff, _max_diff(g.logits, seen) if seq == got else float("inf"))
            ids = PROMPTS["long"]
            eos = refs["long"][0][len(ids) + 2]  # the third new token
            want, _ = hf_greedy(model, ids, NEW_TOKENS, eos=eos)
            got = runner.generate(ids, NEW_TOKENS, eos_token_ids=[eos], use_prefill=True)
            if got != want:
                return {**row, "status": "mismatch", "reason": f"EOS {eos}: onert stops after {len(got) - len(ids)} "
                        f"new tokens, transformers after {len(want) - len(ids)}"}
    except RuntimeFailure as e:
        return {**row, "status": "runtime", "reason": f"{type(e).__name__}: {ms._first_line(e)}"}
    except CircleFxError as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {ms._first_line(e)}"}
    row.update(max_logit_diff=diff)
    if pkg.manifest["decode"].get("recompute"):
        row["reason"] = "decode recomputes the whole window each step (no cache: " + \
            pkg.manifest["decode"]["recompute"]["why"] + ")"
    if diff > LOGIT_TOL:
        if split_diff > LOGIT_TOL:
            return {**row, "status": "logits differ", "reason": f"same tokens, but the logits differ by {diff:.2g} "
                    f"(> {LOGIT_TOL:g}), also from transformers fed the prompt as the runner feeds it"}
        row["reason"] = ((row.get("reason", "") + "; ") if row.get("reason") else "") + (
            f"logits within {split_diff:.2g} of transformers fed the prompt as the runner feeds it; its one-forward "
            "generate differs: its logits depend on how the prompt is split")
    return {**row, "status": "ok"}


STATUS = {"ok": "yes", "mismatch": "WRONG tokens", "logits differ": "tokens only (logits differ)",
          "split": "as transformers fed alike", "runtime": "onert fails", "refused": "no (refused)",
          "failed": "no", "no reference": "n/a", "not exported": "no (export fails)", "skipped": "skipped"}


def markdown(rows: list[dict]) -> str:
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    ok = [r for r in rows if r["status"] == "ok"]
    recomputed = sum(1 for r in rows if r["status"] == "ok" and "recomputes" in r.get("reason", ""))
    exported = [r for r in rows if r["status"] not in ("skipped", "not exported")]
    lines = [
        "# Generation support: transformers causal-LM families",
        "",
        "Generated by `scripts/generation_support.py` (do not edit by hand). The families and their tiny",
        "random models are those of [model-support.md](model-support.md) (`scripts/hf_families.py`). Each",
        "family `circle_fx.export` runs is exported with `circle_fx.export_llm(model,",
        f"max_seq_len={MAX_SEQ_LEN}, prefill_len={PREFILL_LEN})` and generates with `LLMRunner.generate` in onert",
        "0.1.0, against `model.generate(do_sample=False)` in transformers: a prompt shorter than",
        f"`prefill_len` ({len(PROMPTS['short'])} tokens) and one longer ({len(PROMPTS['long'])}), each through the "
        f"prefill model and through decode steps only, {NEW_TOKENS} new tokens compared token for token; then the",
        "token transformers generates third is made the EOS id of both, which must stop at the same place.",
        "The generation config's logits processors (e.g. BART's `forced_eos_token_id`) are off in the",
        "reference, as in the runner's greedy. Models with conv / recurrent state prefill exact-length",
        "prompts only: their short prompt goes through decode steps. Models are built as decoders",
        "(`config.is_decoder = True` where the config has it: BERT-style `…ForCausalLM` classes default to a",
        "bidirectional mask and no cache).",
        "",
        f"**{len(ok)} of {len(exported)} families that `export` runs generate transformers' exact tokens**"
        f" (from logits within {LOGIT_TOL:g}).",
        "",
        f"{recomputed} of them carry no cache: their decode model recomputes the whole window each step",
        "(`decode.recompute` in the manifest: the forward takes no cache, or the model derives its positions",
        "from the cache length as a Python number, so a decode step would be wrong), exact for a causal",
        "decoder and costing a `max_seq_len`-token forward per new token.",
        "",
        "Status: *yes* = same tokens everywhere (*max logit diff*: the largest difference of the logits",
        "each token was picked from); *no (refused)* = `export_llm` refuses the model with a circle_fx",
        "error naming why; *no* = `export_llm` fails; *WRONG tokens* = it exports but generates",
        "other tokens (the first difference is named); *as transformers fed alike* = other tokens than",
        "`model.generate`, but the ones transformers itself generates when fed the prompt as the runner",
        "feeds it (prefill, then one token a step): the reference depends on how the prompt is split;",
        f"*tokens only (logits differ)* = the same tokens from logits more than {LOGIT_TOL:g} apart;",
        "*n/a* = transformers' own `generate` fails on",
        "the tiny model; *no (export fails)* = `circle_fx.export` does not run the family either.",
        "",
        "| family | class | generates | max logit diff | layer types | reason / note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = f"{r['max_logit_diff']:.2g}" if "max_logit_diff" in r else ""
        lines.append("| " + " | ".join(cell(c) for c in (
            r["family"], r["class"], STATUS.get(r["status"], r["status"]), diff,
            ", ".join(r.get("layer_types", [])), r.get("reason", ""))) + " |")
    return "\n".join(lines) + "\n"


def families() -> list[hf.HfFamily]:
    """Every enumerated family; those ``export`` does not run (or skips) carry that reason as
    their ``skip``, so they are listed without being built again."""
    exported = _export_rows()
    out = []
    for fam in hf.enumerate_families():
        known = exported.get(fam.model_type)
        if fam.skip is None and known is not None and known["status"] != "ok":
            fam = hf.HfFamily(fam.model_type, fam.model_class, ("export: " if known["status"] != "skipped" else "")
                              + known.get("reason", known["status"]))
        out.append(fam)
    return out


def main(argv: list[str]) -> int:
    import circle_fx  # noqa: F401 - imported once in the parent, every forked child has it
    import circle_fx.emit.lowerings  # noqa: F401
    import circle_fx.llm  # noqa: F401

    jobs, cache, _, argv = ms.options(argv)
    all_fams = families()
    fams = [f for f in all_fams if f.model_type in argv] if argv else all_fams
    exported = _export_rows()

    def report(row):
        print(f"{row['family']:28s} {row['status']:12s} {row.get('seconds', ''):>6} {row.get('reason', '')[:160]}",
              flush=True)

    rows = ms.gather(fams, jobs, cache, report, check_fn=check)
    if rows is None:
        return 1
    for r in rows:  # a family export does not run: say so (run_all records it as skipped)
        if r["status"] == "skipped" and exported.get(r["family"], {}).get("status") not in (None, "ok", "skipped"):
            r["status"] = "not exported"
    ms.publish(rows, argv, OUT, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
