"""``export_llm``: a transformers causal LM -> prefill + decode Circle models + manifest.

How the model is driven (no source patching, no module swapping): each entry point is a
small wrapper module (``cache.py``) that calls the user's model's own ``forward`` with

- ``cache=`` a :class:`~circle_fx.llm.cache.GraphCache` (transformers' public Cache API:
  the attention layers hand it their post-RoPE keys/values, it returns what to attend to);
- ``position_ids`` (decode: the ``position`` input; prefill: constants ``0..P-1``);
- a prepared 4-D attention mask (per layer type when the model has sliding-window layers),
  built from compile-time index vectors compared with the run-time position: onert has no
  RANGE/CUMSUM and no DYNAMIC_UPDATE_SLICE, and this needs neither.

Two files, not one with two signatures: onert 0.1.0 ignores SignatureDefs and always runs
subgraph 0. In the decode model the RoPE fusion family (``circle_fx/fusions/rope.py``, in
the default pipeline) replaces HF's decomposed ``q*cos + rotate_half(q)*sin`` by Circle's
ROPE op (exact in onert for one position per call); in the prefill model its check keeps
the decomposed form, because onert's ROPE applies the first table row to every position.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field

import torch

from .. import api
from ..errors import CaptureError, CircleFxError, InputError, ModelError, UnsupportedDtypeError
from ..passes import default_pipeline
from ..meta import CONSTANT_NAMES
from ..quant.plan import quant_plan
from ..passes.cached_attention import CachedAttention
from ..passes.gqa import GroupedQueryAttention
from . import manifest as mf
from .package import LLMPackage
from .text import default_tokenizer, text_assets, text_encoder

try:
    from .cache import (ATTENTION_KINDS, STATE_KINDS, STATELESS_KINDS, DecodeStep, Prefill, State, causal,
                        decode_matches_prefill, decode_self_check, layer_kinds, probe_caches, rings_check,
                        slot_dependent, with_rings)
except ImportError as _e:  # transformers is an optional extra of circle_fx
    DecodeStep = Prefill = State = causal = decode_matches_prefill = decode_self_check = None
    layer_kinds = probe_caches = rings_check = slot_dependent = with_rings = None
    ATTENTION_KINDS = STATE_KINDS = STATELESS_KINDS = ()
    _MISSING = _e


@dataclass
class LLMSpec:
    """What the wrappers need to know about the model and the export."""

    num_layers: int
    vocab_size: int
    max_seq_len: int
    prefill_len: int
    sliding_window: int | None
    float_mask: bool
    torch_dtype: torch.dtype
    cache_kw: str
    #: ``attention_chunk_size`` of a model with ``chunked_attention`` layers (Llama 4): those
    #: attend within their chunk of positions only (a mask per layer type, like sliding windows)
    attention_chunk: int | None = None
    #: the decode step writes the new K/V row into the cache at its position instead of appending
    #: it (:func:`~circle_fx.llm.cache.slot_dependent`: the model's attention reads the key's slot)
    kv_in_place: bool = False
    #: every layer's named state tensors (:class:`~circle_fx.llm.cache.State`: K/V with their
    #: geometry, conv windows, recurrent states), read by :func:`~circle_fx.llm.cache.probe_caches`
    caches: list = field(default_factory=list)
    #: the names ``model.forward`` takes (``use_cache``, ``logits_to_keep`` are passed only if taken)
    forward_params: frozenset = frozenset()
    #: why the decode model recomputes the whole ``max_seq_len`` window each step instead of
    #: carrying a cache (None: it carries one). Exact for a causal model (checked); costs a
    #: ``max_seq_len``-token forward per new token. See :func:`export_llm`.
    recompute: str | None = None
    #: the decode step's ``get_seq_length`` answers the run-time position (see :func:`_capture_decode`)
    decode_length_input: bool = True
    #: cache-length buckets of the decode step / prompt lengths of the prefill, ascending, the
    #: last = ``max_seq_len`` / ``prefill_len`` (:func:`bucket_lengths`); one length = no buckets
    decode_buckets: list = field(default_factory=list)
    prefill_buckets: list = field(default_factory=list)

    def cache_names(self) -> list[str]:
        return [c.name for c in self.caches]

    @property
    def prefill_pads(self) -> bool:
        """Can a shorter prompt be right-padded in the prefill model? Only if every state is
        written at positions (K/V): a conv window or recurrent state after P tokens is not the
        state after the prompt's last real token."""
        return all(c.positional for c in self.caches)


def model_spec(model, max_seq_len: int, prefill_len: int | None) -> LLMSpec:
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise InputError(f"export_llm takes a transformers causal LM (a PreTrainedModel with .config), "
                         f"got {type(model).__name__}")
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise InputError(f"max_seq_len must be an int >= 2, got {max_seq_len!r}")
    prefill_len = max_seq_len if prefill_len is None else prefill_len
    if not isinstance(prefill_len, int) or not 1 <= prefill_len <= max_seq_len:
        raise InputError(f"prefill_len must be an int in 1..max_seq_len ({max_seq_len}), got {prefill_len!r}")
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    params = inspect.signature(model.forward).parameters
    if "input_ids" not in params:
        raise InputError(f"{type(model).__name__}.forward takes no input_ids; export_llm needs a transformers "
                         "causal LM (…ForCausalLM)")
    cache_kw = "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise UnsupportedDtypeError(f"the model's weights are {dtype}; export_llm supports float32 "
                                    "(onert 0.1.0 has no float16 path): call model.float() first")
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in ("sdpa", "eager"):
        raise InputError(f"attention implementation {impl!r} is not supported; load the model with "
                         "attn_implementation='sdpa' or 'eager'")
    kinds = layer_kinds(cfg)
    known = ATTENTION_KINDS + STATE_KINDS + STATELESS_KINDS
    recompute = None if cache_kw else f"{type(model).__name__}.forward takes no cache argument"
    if kinds is not None and set(kinds) - set(known):  # no cache driving for them: recompute (see export_llm)
        recompute = recompute or (f"export_llm carries no cache for layer types {sorted(set(kinds) - set(known))} "
                                  f"(it does for {', '.join(known)})")
    sliding = None
    if (kinds is not None and "sliding_attention" in kinds) or (kinds is None and getattr(cfg, "sliding_window", None)):
        sliding = int(cfg.sliding_window)
    chunk = int(cfg.attention_chunk_size) if kinds is not None and "chunked_attention" in kinds else None
    return LLMSpec(num_layers=cfg.num_hidden_layers, vocab_size=cfg.vocab_size, max_seq_len=max_seq_len, prefill_len=prefill_len,
                   sliding_window=sliding, float_mask=impl == "eager", torch_dtype=dtype, cache_kw=cache_kw,
                   attention_chunk=chunk, forward_params=frozenset(params),
                   recompute=recompute)


def _rename_inputs(program, names: list[str]) -> None:
    """Give the captured placeholders the manifest's names (``caches_3`` -> ``value_cache_1``)."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, names):
        if node.name != name:
            node._rename(name)
    program.input_names = [n.name for n in placeholders]


def _capture(module, args, input_names, pipeline, quantize=None, limits=None, weight_cache=None, program=None,
             checkpoint=None):
    if program is None:
        with _stage("capture"):
            program = api.capture(module, args)
    if checkpoint is not None:  # a weightless model: its placeholders become the checkpoint's lazy weights
        from .weights import lazify

        lazify(program, checkpoint)
    _rename_inputs(program, input_names)
    # the wrapper holds the model as ``.model``: name weights as the user's model does, so
    # ``QuantConfig.skip``/``overrides`` patterns and messages read ``model.layers.0...``, not ``model.model...``
    names = program.gm.meta.get(CONSTANT_NAMES, {})
    names.update({k: v[len("model."):] for k, v in names.items() if v.startswith("model.")})
    program.limits = limits  # stored in the file (circle_fx.limits metadata)
    program.shared_weights = True  # every entry point reads the same weights (emit/linear_form.py)
    return api.lower(program, passes=pipeline, quantize=quantize, weight_cache=weight_cache)


#: why a decode step captured with a run-time cache length fails and with 0 would be wrong
WRONG_POSITIONS = ("{cls} derives its positions from the cache length as a Python number (a decode step captured "
                   "with a run-time length fails, with 0 it is wrong)")


def _capture_decode(model, spec, args, input_names, pipeline, quantize, limits, weight_cache=None, checks=None):
    """The decode step -> ``(model, None)``, or ``(None, why)`` when a cached decode step would
    not be exact (the package then recomputes, see :func:`export_llm`).

    ``Cache.get_seq_length()`` answers the run-time ``position`` (decoders without
    ``position_ids`` derive their positions from it, see
    :meth:`~circle_fx.llm.cache.GraphCache.get_seq_length`). A model that uses that length as
    a Python number (a branch, a slice bound, ``arange``'s start: GIT, MVP, RoFormer, MPT,
    TrOCR) cannot be captured with a run-time value; it is captured with 0 if that is still
    exact (:func:`~circle_fx.llm.cache.decode_matches_prefill` within 1e-5: GIT and MPT, which
    are given ``position_ids`` / read it for a slice), not otherwise (MVP, RoFormer, TrOCR: their
    positions would all be 0). Either way the decode step is self-checked in eager first
    (:func:`~circle_fx.llm.cache.decode_self_check`): state the model keeps outside the cache
    (RecurrentGemma) or carries in a way the cache does not reproduce (Zaya) is found there."""
    # torch.export prints the partial graph to stderr when a data-dependent guard fails: that
    # failure is expected here, so the first attempt's stderr is shown only if it succeeds
    err, shapes_log = io.StringIO(), logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    try:
        shapes_log.setLevel(logging.ERROR)  # ... and logs a warning about the unbacked symbol
        with contextlib.redirect_stderr(err), _stage("capture"):
            program = api.capture(DecodeStep(model, spec), args)
        sys.stderr.write(err.getvalue())
        length_input = True
    except (CaptureError, InputError):
        length_input = False
        if not decode_matches_prefill(*checks, past_length_input=False, tol=1e-5):
            return None, WRONG_POSITIONS.format(cls=type(model).__name__)
        with _stage("capture"):
            program = api.capture(DecodeStep(model, spec, past_length_input=False), args)
    finally:
        shapes_log.setLevel(level)
    why = decode_self_check(*checks, past_length_input=length_input)
    if why:
        return None, f"{type(model).__name__}: {why}"
    spec.decode_length_input = length_input
    return _capture(None, args, input_names, pipeline, quantize, limits, weight_cache, program=program,
                    checkpoint=_checkpoint(model)), None


def _capture_decode_bucket(model, spec, rows, args, input_names, pipeline, quantize, limits, weight_cache):
    """The decode step of one cache-length bucket (:class:`DecodeStep` ``rows``): the same inputs
    as the full step, captured as it was (``spec.decode_length_input``); not re-checked in eager:
    a bucket computes the full step's function for positions < ``rows`` (its masks hide the rows
    it drops), which the tests check against transformers."""
    step = DecodeStep(model, spec, past_length_input=spec.decode_length_input, rows=rows)
    with _stage("capture"):
        program = api.capture(step, args)
    return _capture(None, args, input_names, pipeline, quantize, limits, weight_cache, program=program,
                    checkpoint=_checkpoint(model))


#: ``buckets="auto"``: decode cache-length buckets 256, 1024, 4096, ... below ``max_seq_len``
#: (when it is > 256), prefill lengths 32, 128, ... below ``prefill_len`` (when it is >= 256):
#: powers of 4, so a step or prompt computes at most 4x what it needs, and each bucket costs a
#: capture at export (measured, benchmarks/README.md "llm_buckets"). No 8-id prefill bucket:
#: on SmolLM2-135M it prefilled 8 ids no faster than the 32-id bucket does (the weights are read
#: once per call either way), so it would only cost export time. Small packages (every test's)
#: get one bucket of each.
AUTO_DECODE, AUTO_PREFILL = (256, 257), (32, 256)


def _powers(first: int, total: int) -> list[int]:
    out, b = [], first
    while b < total:
        out.append(b)
        b *= 4
    return out + [total]


def bucket_lengths(buckets, max_seq_len: int, prefill_len: int) -> tuple[list[int], list[int]]:
    """``(decode, prefill)`` bucket lengths, each ascending and ending with ``max_seq_len`` /
    ``prefill_len``. ``buckets``: ``"auto"`` (:data:`AUTO_DECODE`), ``None`` / ``"off"`` (one of
    each, as before buckets existed), or ``{"decode": [...], "prefill": [...]}`` (either key may
    be missing or "auto" / "off"; lengths above the total are refused)."""
    def one(value, total, first, start, what):
        if value in (None, "off"):
            return [total]
        if value == "auto":
            return _powers(first, total) if total >= start else [total]
        try:
            lengths = sorted({int(v) for v in value})
        except (TypeError, ValueError):
            raise InputError(f"{what} buckets must be 'auto', 'off' or a list of lengths, got {value!r}") from None
        if not lengths or lengths[0] < 1 or lengths[-1] > total:
            raise InputError(f"{what} bucket lengths must be in 1..{total}, got {value!r}")
        return lengths if lengths[-1] == total else lengths + [total]

    if buckets is None or isinstance(buckets, str):
        if buckets not in (None, "auto", "off"):
            raise InputError(f"buckets must be 'auto', 'off', None or a dict, got {buckets!r}")
        decode = prefill = buckets
    elif isinstance(buckets, dict):
        unknown = set(buckets) - {"decode", "prefill"}
        if unknown:
            raise InputError(f"buckets takes the keys 'decode' and 'prefill', got {sorted(unknown)}")
        decode, prefill = buckets.get("decode", "auto"), buckets.get("prefill", "auto")
    else:
        raise InputError(f"buckets must be 'auto', 'off', None or a dict, got {buckets!r}")
    return (one(decode, max_seq_len, AUTO_DECODE[0], AUTO_DECODE[1], "decode"),
            one(prefill, prefill_len, AUTO_PREFILL[0], AUTO_PREFILL[1], "prefill"))


def _pipelines(rope_op: bool):
    decode_pipe, prefill_pipe = default_pipeline(), default_pipeline()
    for pipe in (decode_pipe, prefill_pipe):
        pipe.insert_after("fuse_rms_norm", GroupedQueryAttention())
    # the decode step's attention over cat([cache, new row]) reads the cache without copying it
    decode_pipe.insert_after("grouped_query_attention", CachedAttention())
    if not rope_op:  # the RoPE family is in the default pipeline; it fuses only the decode model
        decode_pipe.remove_pass("fuse_rope")
    return decode_pipe, prefill_pipe


def _capture_prefill(model, spec, pipeline, quantize, weight_cache, length: int | None = None,
                     bucket: int | None = None):
    """A :class:`Prefill` model of ``length`` ids (default ``prefill_len``); ``bucket``: a prefill
    bucket computing only its first ``bucket`` ids of ``prefill_len`` (``Prefill.pad_to``)."""
    n = length or spec.prefill_len
    args = (torch.zeros(1, n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    limits = {"max_seq_len": spec.max_seq_len, "inputs": {"last_index": {"index_range": [0, (bucket or n) - 1]}}}
    if length is None:
        limits["prefill_len"] = n
    wrapper = Prefill(model, spec, length=length) if bucket is None else Prefill(model, spec, length=bucket, pad_to=n)
    return _capture(wrapper, args, ["input_ids", "last_index"], pipeline, quantize,
                    limits, weight_cache, checkpoint=_checkpoint(model))


def _checkpoint(model):
    """The :class:`~circle_fx.llm.weights.LazyCheckpoint` of a model built without weights, or None."""
    from .weights import ATTR

    return getattr(model, ATTR, None)


def _probe(model, spec):
    """:func:`~circle_fx.llm.cache.probe_caches`; for a weightless model (placeholder weights,
    :mod:`~circle_fx.llm.weights`) under ``FakeTensorMode``: only the states' shapes are read,
    and nothing of the full-size forward is computed."""
    if _checkpoint(model) is None:
        return probe_caches(model, spec)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return probe_caches(model, spec)


def _checks(model, spec):
    """``(model, spec)`` the eager checks of the cache driving run on: the model itself, or a
    weightless model's random-weight check copy (:func:`~circle_fx.llm.weights.check_config`)
    with a spec of its own (its cache states probed)."""
    ckpt = _checkpoint(model)
    if ckpt is None:
        return model, spec
    small = ckpt.check_model()
    small_spec = model_spec(small, spec.max_seq_len, spec.prefill_len)
    small_spec.caches = probe_caches(small, small_spec) if spec.caches else []
    small_spec.kv_in_place = spec.kv_in_place
    return small, small_spec


@contextlib.contextmanager
def _stage(name: str):
    """Time a conversion stage into :data:`STAGES` (the big-model benchmark's breakdown)."""
    import time

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        wall, cpu = STAGES.get(name, (0.0, 0.0))
        STAGES[name] = (wall + time.perf_counter() - t0, cpu + time.process_time() - c0)


#: ``{stage: (wall s, CPU s)}`` summed over the export (reset by :func:`export_llm`)
STAGES: dict[str, tuple[float, float]] = {}


def _export_cached(model, spec, rope_op, quantize):
    """(decode, prefill) carrying the states :func:`~circle_fx.llm.cache.probe_caches` finds;
    (None, None) with ``spec.recompute`` set when a cached decode step would not be exact (see
    :func:`_capture_decode`)."""
    S = spec.max_seq_len
    with model_errors(model):
        spec.caches = _probe(model, spec)
        if not spec.caches:
            spec.recompute = f"no layer of {type(model).__name__} hands a state to the cache"
            return None, None
        checks = _checks(model, spec)
        spec.kv_in_place = checks[1].kv_in_place = slot_dependent(*checks)
        # sliding-window layers keep only their window, as ring buffers (decided after
        # slot_dependent, which compares full caches; a slot-dependent model keeps them full),
        # by the config the decode step's masks are chosen by (cache._masks), if the model's own
        # logits come out of rings where they wrap (cache.rings_check, on the full caches)
        rings = with_rings(model.config, spec, spec.caches)
        if rings != spec.caches:
            check_model, check_spec = checks
            if rings_check(check_model, check_spec, check_spec.caches):
                spec.caches = rings
                if check_spec is not spec:
                    check_spec.caches = with_rings(check_model.config, check_spec, check_spec.caches)
            else:
                warnings.warn(f"export_llm: {type(model).__name__}'s sliding-window layers keep max_seq_len cache "
                              f"rows: decode steps over ring caches did not give its whole-prompt logits in eager "
                              f"(cache.rings_check)", stacklevel=3)
        if _transpose_values(spec):  # value caches as [1, H, D, S]: the decode step reads them without a copy
            _set_value_layout(spec, checks[1], transposed=True)
        decode_pipe, prefill_pipe = _pipelines(rope_op)
        caches = [torch.zeros(c.shape, dtype=spec.torch_dtype) for c in spec.caches]
        ids1, pos = torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        weights = {}  # both programs read the same parameters: each weight quantized once, stored once in memory
        names = ["input_ids", "position", *spec.cache_names()]
        limits = {"max_seq_len": S, "inputs": {"position": {"index_range": [0, S - 1]}}}
        decode, why = _capture_decode(model, spec, (ids1, pos, caches), names, decode_pipe, quantize, limits, weights,
                                      checks)
        if decode is not None and not values_read_in_place(decode, spec):
            # the model's attention is not the one CachedAttention takes (eager attention's matmuls, ...):
            # a transposed value cache would cost a TRANSPOSE per step, so keep the plain layout
            _set_value_layout(spec, checks[1], transposed=False)
            caches = [torch.zeros(c.shape, dtype=spec.torch_dtype) for c in spec.caches]
            decode, why = _capture_decode(model, spec, (ids1, pos, caches), names, decode_pipe, quantize, limits,
                                          weights, checks)
        if decode is None:
            spec.recompute = why
            return None, None
        if not spec.prefill_pads:  # conv / recurrent state: a bucket would pad the prompt
            spec.prefill_buckets = [spec.prefill_len]
        full_prefill = _capture_prefill(model, spec, prefill_pipe, quantize, weights)
        try:
            decode = [_capture_decode_bucket(model, spec, rows, (ids1, pos, caches), names, decode_pipe, quantize,
                                             limits, weights) for rows in spec.decode_buckets[:-1]] + [decode]
        except Exception as e:  # the full step captured and lowered: a failing bucket leaves it alone
            _no_buckets(spec, "decode", e)
            decode = [decode]
        try:
            prefill = [_capture_prefill(model, spec, prefill_pipe, quantize, weights, bucket=n)
                       for n in spec.prefill_buckets[:-1]] + [full_prefill]
        except Exception as e:  # as for decode: the full prefill works
            _no_buckets(spec, "prefill", e)
            prefill = [full_prefill]
        return decode, prefill


#: ``"auto"``: value caches kept transposed when the decode step's attention can read them so (an SDPA
#: model that does not write its K/V in place; checked after the capture, see :func:`values_read_in_place`);
#: ``"always"`` tries it for every model (the tests' way to reach the check's fallback), ``"never"`` never
TRANSPOSE_VALUES = "auto"


def _transpose_values(spec) -> bool:
    if TRANSPOSE_VALUES == "never" or spec.kv_in_place:
        return False
    # eager attention (float masks) is matmul + softmax + matmul, which CachedAttention does not take
    return TRANSPOSE_VALUES == "always" or not spec.float_mask


def _set_value_layout(spec, check_spec, transposed: bool) -> None:
    """Keep the value caches (``State`` kind ``"value"``, carried at positions) as ``[1, H, D, S]``
    (``transposed``) or ``[1, H, S, D]``, in ``spec`` and in the eager checks' spec."""
    for sp in {id(spec): spec, id(check_spec): check_spec}.values():
        sp.caches = [(c.transposed() if transposed else State(c.kind, c.layer, c.index, c.rows_shape, c.carry))
                     if c.kind == "value" and c.carry == "position" and (c.axis == 3) != transposed else c
                     for c in sp.caches]


def values_read_in_place(decode, spec) -> bool:
    """Does every transposed value cache input of the decode model feed only BATCH_MATMULs that read
    it as it is (``adjointRhs``, from ``circle.cached_attention``)? Anything else (a TRANSPOSE of the
    cache back to rows) would copy it on every step."""
    from ..circle.schema import BO

    b = decode.builder
    wanted = {c.name for c in spec.caches if c.axis == 3}
    inputs = {t for t, name in zip(b.inputs, b.input_names) if name in wanted}
    for op in b.operators:
        if inputs & set(op.inputs) and not (op.code == BO.BATCH_MATMUL and getattr(op.options, "adjointRhs", False)):
            return False
    return True


def _no_buckets(spec, part: str, error) -> None:
    """A bucket the model's code cannot be captured at: the package keeps one ``part`` (as with
    ``buckets="off"``), exact as before, and says why."""
    warnings.warn(f"export_llm: no {part} buckets ({getattr(spec, part + '_buckets')}): a bucket's capture failed: "
                  f"{(str(error).splitlines() or [''])[0]}", stacklevel=3)
    setattr(spec, f"{part}_buckets", [spec.max_seq_len if part == "decode" else spec.prefill_len])


def _export_recompute(model, spec, rope_op, quantize):
    """(decode, prefill) of a package that recomputes (``spec.recompute``): no state in or out;
    the decode model is the prefill wrapper over the whole ``max_seq_len`` window and the host
    keeps the ids. Both call the model with ``input_ids`` alone (as ``circle_fx.export`` does:
    its own causal mask and positions, no cache), which is exact for a right-padded window only
    if the model is causal: checked first."""
    spec.caches, spec.kv_in_place = [], False
    if not causal(*_checks(model, spec)):
        raise InputError(f"{spec.recompute}, and export_llm cannot recompute it over a padded window: its logits at "
                         f"a position depend on the tokens after it (not a causal decoder)")
    decode_pipe, prefill_pipe = _pipelines(rope_op)
    weights = {}
    decode = _capture_prefill(model, spec, decode_pipe, quantize, weights, length=spec.max_seq_len)
    return decode, _capture_prefill(model, spec, prefill_pipe, quantize, weights)


def export_llm(model, max_seq_len: int, prefill_len: int | None = None, *, rope_op: bool = True,
               eos_token_ids=None, quantize=None, tokenizer="auto", buckets="auto") -> LLMPackage:
    """Export ``model`` (a transformers ``…ForCausalLM``, float32) as a prefill model and a
    decode-step model with an explicit KV cache of ``max_seq_len`` positions per layer.

    ``prefill_len`` (default ``max_seq_len``) is the fixed prompt length of the prefill model
    (shorter prompts are right-padded; longer ones continue through decode). ``rope_op``:
    use Circle's ROPE op in the decode model (False keeps the decomposed form). Both models
    also run :class:`~circle_fx.passes.gqa.GroupedQueryAttention` (no K/V head copies).
    ``eos_token_ids`` overrides the ones recorded from ``model.generation_config``.
    ``quantize``: as for :func:`circle_fx.export` (``"int8-weights"``: both models store int8
    linear weights and a uint8 embedding; caches and activations stay float32).
    ``tokenizer``: a transformers tokenizer, a ``tokenizers.Tokenizer``, or a path (a
    ``tokenizer.json`` or a ``save_pretrained`` directory), stored in the package as
    ``tokenizer.json`` with the chat template (``LLMRunner.generate_text``); ``"auto"`` takes
    the one saved next to the model's weights if the model was loaded from such a directory,
    ``None`` stores none (ids only). The generation config is stored in any case.
    ``buckets``: several decode steps over cache lengths (and prefill models over prompt lengths)
    sharing every weight in ``model.circle``, chosen in the graph by the position / the prompt's
    last index (an IF chain), so a step or a prompt costs what it uses rather than
    ``max_seq_len`` / ``prefill_len`` (:func:`bucket_lengths`: ``"auto"`` = powers of 4 from 256
    cache rows / 32 ids, one bucket for small packages; ``"off"``; or the lengths). Each bucket is
    one more capture at export time.
    Returns an :class:`LLMPackage` (``.save(dir)``, ``.runner()``).

    A model that cannot carry a cache through the decode model — its forward takes none (GPT-1,
    RWKV's ``state`` is no ``Cache``), it has layer types export_llm carries no cache for
    (DeepSeek-V4's compressed attention), its own code refuses or breaks on the cache (MiniMax
    wants its own cache class; Bloom builds ALiBi from a 2-D mask), or it derives its positions
    from the cache length as a Python number so a decode step would be wrong (MVP, RoFormer,
    TrOCR: :func:`~circle_fx.llm.cache.decode_matches_prefill`) — gets a decode model that *recomputes*:
    the prefill wrapper over the whole ``max_seq_len`` window, the host keeping the ids
    (manifest ``decode.recompute``). Exact for a causal model (checked: a model whose logits
    depend on later tokens is refused); each new token costs a ``max_seq_len``-token forward.
    """
    if DecodeStep is None:
        raise InputError(f"export_llm needs transformers (pip install transformers): {_MISSING}")
    plan = quant_plan(quantize).fitted(model)  # a bad value fails before the (slow) captures
    STAGES.clear()
    if isinstance(tokenizer, str) and tokenizer == "auto":
        tokenizer = default_tokenizer(model)
    text, assets = text_assets(tokenizer, model)  # a bad tokenizer fails before the calibration too
    with _stage("calibration"):  # q4_0's data-free calibration: not for a weightless (streamed) model
        plan = plan.calibrated(model, why_not=None if _checkpoint(model) is None else
                               "its weights are streamed from the checkpoint as they are packed (no float copy "
                               "to run); --calibration FILE, or load it in memory, calibrates",
                               encode=text_encoder(tokenizer))
    with model_errors(model):
        spec = model_spec(model, max_seq_len, prefill_len)
    spec.decode_buckets, spec.prefill_buckets = bucket_lengths(buckets, spec.max_seq_len, spec.prefill_len)
    training = model.training
    model.eval()
    try:
        decode = prefill = None
        if not spec.recompute:
            try:
                decode, prefill = _export_cached(model, spec, rope_op, plan)
            except (ModelError, CaptureError) as e:  # transformers' or the model's own code refused our cache
                spec.recompute = f"its cached decode step fails: {(str(e).splitlines() or [''])[0]}"
        if spec.recompute:
            warnings.warn(f"export_llm: the decode model recomputes the whole max_seq_len window each step: "
                          f"{spec.recompute}", stacklevel=2)
            with model_errors(model):
                decode, prefill = _export_recompute(model, spec, rope_op, plan)
            spec.decode_buckets, spec.prefill_buckets = [spec.max_seq_len], [spec.prefill_len]
            decode, prefill = [decode], [prefill]
    finally:
        model.train(training)
    # one file: both entry points as subgraphs sharing every weight, one onert session (emit/entry_points.py);
    # an entry point with buckets is an IF chain over them on its selector input
    one = api.entry_points([_entry("prefill", prefill, spec.prefill_buckets, "last_index"),
                            _entry("decode", decode, spec.decode_buckets, "position")])
    decode, prefill = decode[-1], prefill[-1]  # the full-length ones: the entry points' interface
    manifest = build_manifest(model, spec, decode, prefill, eos_token_ids, one=one)
    legacy = build_manifest(model, spec, decode, prefill, eos_token_ids)  # LLMPackage.save(layout="two")
    for m in (manifest, legacy):
        m["weights"] = mf.weights_entry(plan.weights, decode, prefill)
        m["text"] = text
    assets = {**assets, mf.CONFIG_FILE: mf.config_json(model)}
    return LLMPackage(manifest, decode=decode, prefill=prefill, assets=assets, model=one, legacy=legacy)


def _entry(part: str, models: list, lengths: list, selector: str):
    """``(part, CircleModel)``, or ``(part, Buckets)`` of several (bucket k runs when the
    selector < lengths[k]: position < cache rows, last_index < prompt length)."""
    if len(models) == 1:
        return part, models[0]
    return part, api.entry_buckets(models, selector, lengths[:-1], [f"{part}_{n}" for n in lengths])


@contextlib.contextmanager
def model_errors(model):
    """Any exception that is not a circle_fx error (transformers' own, or the model code's,
    raised while export_llm reads the config or runs the model) becomes a
    :class:`~circle_fx.errors.ModelError` naming the family, the cause and the line that raised."""
    try:
        yield
    except CircleFxError:
        raise
    except Exception as e:
        cfg = getattr(model, "config", None)
        family = f"{type(model).__name__} (model_type {getattr(cfg, 'model_type', None)!r})"
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [raised at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        first = (str(e).strip().splitlines() or [""])[0]
        raise ModelError(f"export_llm cannot drive {family}: {type(e).__name__}: {first}{where}") from e


def _token_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def build_manifest(model, spec: LLMSpec, decode, prefill, eos_token_ids=None, one=None) -> dict:
    """The package manifest (:mod:`~circle_fx.llm.manifest`); ``one``: the one-file model
    (:func:`circle_fx.api.entry_points`), whose input/output slots the parts then name."""
    gen = getattr(model, "generation_config", None)
    cfg = model.config
    eos = _token_ids(eos_token_ids) if eos_token_ids is not None else _token_ids(
        getattr(gen, "eos_token_id", None) if gen is not None else getattr(cfg, "eos_token_id", None))
    pad = getattr(gen, "pad_token_id", None) if gen is not None else None
    if pad is None:
        pad = getattr(cfg, "pad_token_id", None)
    shapes = {c.name: list(c.shape) for c in spec.caches}
    rings = any(c.carry == "ring" for c in spec.caches)
    transposed = any(c.carry == "position" and c.axis == 3 for c in spec.caches)
    kv = [list(c.rows_shape) for c in spec.caches if c.kind in ("key", "value")]
    kv_uniform = kv[0] if kv and len({tuple(v) for v in kv}) == 1 else None
    uniform = kv_uniform if len(kv) == len(shapes) and len({tuple(v) for v in shapes.values()}) == 1 else None
    # heads and head_dim are the model's even when ring caches (sliding layers) have fewer rows
    heads_dims = {(v[1], v[3]) for v in kv}
    kv_heads, head_dim = next(iter(heads_dims)) if len(heads_dims) == 1 else (None, None)
    def io(part, cm, which):
        return mf.io_entries(cm.builder, which) if one is None else mf.io_entries(one.builder, which, prefix=f"{part}.")

    out = {
        # the two-file layout (save(layout="two"), for comparisons) is version 1 (its transposed caches carry
        # their axis), or 3 when it has ring caches: a reader of version 1 would take a ring for a replaced
        # state (mf.one_file tells the layouts)
        "format": mf.FORMAT,
        "version": mf.STATES_VERSION if rings or (one is not None and transposed) else mf.VERSION if one is not None else 1,
        "model": {"architecture": type(model).__name__, "model_type": getattr(cfg, "model_type", None),
                  "vocab_size": spec.vocab_size, "num_layers": spec.num_layers,
                  "num_kv_heads": kv_heads, "head_dim": head_dim,
                  "dtype": "float32"},
        "max_seq_len": spec.max_seq_len, "prefill_len": spec.prefill_len, "sliding_window": spec.sliding_window,
        "attention_chunk": spec.attention_chunk,
        "eos_token_ids": eos, "bos_token_id": getattr(cfg, "bos_token_id", None),
        "pad_token_id": int(pad) if isinstance(pad, int) else None,
        "cache": {"layout": "BHSD", "shape": uniform, "shapes": shapes, "dtype": "float32", "initial": 0.0,
                  "bytes": 4 * sum(math.prod(c.shape) for c in spec.caches),
                  "names": spec.cache_names(), "states": mf.states(spec.caches, spec.sliding_window)},
        "prefill": {"file": "prefill.circle", "limits": prefill.builder.limits, "pads": spec.prefill_pads,
                    "inputs": io("prefill", prefill, "inputs"),
                    "outputs": io("prefill", prefill, "outputs"),
                    "cache_writes": mf.cache_writes(spec.caches, "0..length-1 -> positions 0..length-1",
                                                    0, "length")},
        "decode": {"file": "decode.circle", "limits": decode.builder.limits,
                   "inputs": io("decode", decode, "inputs"),
                   "outputs": io("decode", decode, "outputs"),
                   "cache_writes": mf.cache_writes(spec.caches, "0 -> position", "position", 1),
                   "recompute": mf.recompute_entry(spec.recompute)},
    }
    if one is not None:
        out.update(mf.one_file_entries(one.builder))
        lengths = {"prefill": spec.prefill_buckets or [spec.prefill_len], "decode": spec.decode_buckets or [spec.max_seq_len]}
        for part in ("prefill", "decode"):
            out[part].pop("file")
            out[part]["subgraph"] = mf.SUBGRAPHS[part]
            out[part]["buckets"] = mf.buckets_entry(one.builder, part, lengths[part])
            if len(lengths[part]) > 1:  # the full-length bucket's subgraph (the root is an IF chain)
                out[part]["subgraph"] = out[part]["buckets"]["subgraphs"][-1]
    return out
