"""The graph-side cache (K/V and every other per-layer state) and the two traced entry
points (prefill, decode step).

Why a ``transformers.Cache`` subclass and not a re-implemented decoder: the user's model
runs unpatched, through its own ``forward``. Its attention layers call
``cache.update(key_states, value_states, layer_idx)`` (the public Cache API) with the
keys *after* RoPE and any k-norm, exactly what must be cached. :class:`GraphCache`
answers that call functionally, without mutating anything (onert has no
DYNAMIC_UPDATE_SLICE and no variables):

- decode: ``update`` returns ``cat([cache_in, new_row], dim=2)`` — the caller's whole
  cache (a model input, never copied back out) plus the new row; the mask hides the cache
  slots at positions ``>= position``. A model whose attention depends on the key's slot
  (MPT's ALiBi; found by :func:`slot_dependent`) gets ``where(row == position, new_row,
  cache_in)`` instead: key slot j is position j. The new row is recorded and becomes a model
  output, which the host writes into its cache in place (so caches stay bound to onert
  once, see ``runner.py``). The ``cat`` never reaches the file: ``export_llm``'s decode pipeline
  turns the attention over it into ``circle.cached_attention`` (``passes/cached_attention.py``),
  which reads the cache input itself; for it the value caches are kept transposed,
  ``[1, H, D, S]`` (:meth:`State.transposed`, read back as rows here by ``State.as_rows``).
- prefill: ``update`` returns the keys/values of the prompt itself and records them.

Other state goes through transformers' own cache calls the same way (``get_conv_state``,
``update_conv_state``, ``update_recurrent_state``: LFM2's short convolutions, Mamba / Mamba-2
conv windows and SSM states, linear attention): each becomes a named model input and a
model output holding the next state (:class:`State`, ``carry="replace"``).

The attention mask is built here and passed as a prepared 4-D mask (or a dict of them
per layer type for models with sliding-window layers), which ``transformers`` uses
as-is: HF's own mask construction needs ``arange``/run-time sizes that onert lacks.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GraphCache(Cache):
    """Functional per-layer state for tracing. ``past`` maps a :class:`State`'s key
    ``(kind, layer, index)`` to its model input, or is None (prefill: no past). ``new``
    records each state's next value, as the model hands it over:

    - ``update(k, v, layer)`` (attention): the new K/V rows; returns past + new rows (or past
      with them written at ``position``);
    - ``update_conv_state(x, layer, state_idx)`` (short convolutions: LFM2, Mamba's conv1d):
      the last ``conv_kernel_size`` columns of past + ``x``; returns past + ``x`` as
      transformers' ``LinearAttentionLayer`` does;
    - ``update_recurrent_state(s, layer, state_idx)`` (SSM / linear-attention states): ``s``.

    ``get_conv_state``/``get_recurrent_state`` hand out a *clone* of the input (the model's
    fused single-step kernels update it in place with ``copy_``, which torch.export turns into
    a new value); that clone is the next state unless an ``update_*`` call replaces it. A layer
    that reuses another's K/V (Gemma 3n / 4) never calls ``update`` and has no state."""

    def __init__(self, num_layers: int, past: dict | None = None, past_length=0, write_at=None):
        super().__init__(layers=[DynamicLayer() for _ in range(num_layers)])
        self.past = past
        self.write_at = write_at  # decode, in place: [1, 1, S, 1] bool, True at the row of ``position``
        self.past_length = past_length  # what get_seq_length answers (see there)
        self.new: dict[tuple, torch.Tensor] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.new[("key", layer_idx, 0)], self.new[("value", layer_idx, 0)] = key_states, value_states
        if self.past is None:
            return key_states, value_states
        past_k, past_v = self.past[("key", layer_idx, 0)], self.past[("value", layer_idx, 0)]
        if self.write_at is None:
            return torch.cat([past_k, key_states], dim=2), torch.cat([past_v, value_states], dim=2)
        return torch.where(self.write_at, key_states, past_k), torch.where(self.write_at, value_states, past_v)

    def update_indexer(self, indexer_key_states, layer_idx, *args, **kwargs):
        """DeepSeek-V3.2-style sparse attention (``indexed_attention``: DeepSeek-V3.2, GLM-MoE-DSA,
        HY-V4, ...): the indexer's keys ``[B, s, D]`` are one more state written at positions, like
        K/V. It is carried as ``[B, 1, S, D]`` (positions on axis 2, as every ``carry="position"``
        state, so the host writes its rows as it writes K/V) and handed back as ``[B, T, D]``."""
        rows = indexer_key_states.unsqueeze(1)
        self.new[("indexer", layer_idx, 0)] = rows
        if self.past is None:
            return indexer_key_states
        past = self.past[("indexer", layer_idx, 0)]
        full = torch.cat([past, rows], dim=2) if self.write_at is None else torch.where(self.write_at, rows, past)
        return full.squeeze(1)

    def _get(self, kind, layer_idx, state_idx):
        if self.past is None:
            return None
        state = self.past[(kind, layer_idx, state_idx)].clone()
        self.new[(kind, layer_idx, state_idx)] = state
        return state

    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        return self._get("conv", layer_idx, state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self._get("recurrent", layer_idx, state_idx)

    def update_conv_state(self, conv_states, layer_idx: int, state_idx: int = 0, conv_kernel_size=None, **kwargs):
        key = ("conv", layer_idx, state_idx)
        if self.past is None:
            width = conv_kernel_size or conv_states.shape[-1]
            full = conv_states
            if full.shape[-1] < width:
                full = torch.nn.functional.pad(full, (width - full.shape[-1], 0))
        else:
            past = self.past[key]
            width = past.shape[-1]
            full = torch.cat([past, conv_states], dim=-1)
        self.new[key] = full[..., -width:]
        return full

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs):
        self.new[("recurrent", layer_idx, state_idx)] = recurrent_states
        return recurrent_states

    def has_previous_state(self, layer_idx=None, state_idx=None) -> bool:
        return self.past is not None

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def get_seq_length(self, layer_idx: int = 0):
        """How many tokens are cached: 0 in prefill; in decode the run-time ``position`` input
        (a [1] int tensor) when the decode model is captured with ``past_length_input``, else 0.
        Models that take ``position_ids`` never need it; decoders whose forward has no
        ``position_ids`` (Marian, Pegasus, Blenderbot, BigBird-Pegasus) derive their positions
        as ``arange(seq_len) + get_seq_length()``, which a tensor answers without RANGE (the
        ``arange`` is static). A model that uses it as a Python number (a branch, a slice bound,
        ``arange``'s start) cannot take a run-time value: export_llm captures those with 0."""
        return self.past_length

    def get_mask_sizes(self, query_length, layer_idx=0):
        raise AssertionError("circle_fx passes prepared masks; transformers should not build one")


#: how the host carries a state from one call to the next (manifest ``cache.states[].carry``)
AT_POSITION, REPLACE, RING = "position", "replace", "ring"


@dataclass(frozen=True)
class State:
    """One named state tensor of one layer, as the model hands it to the cache: K/V (heads and
    dims read from the model's own tensors, per layer and separately for K and V: Gemma 4's
    per-layer head_dim, MLA's latents) or a conv window / recurrent state.

    ``carry``: ``"position"`` = the model outputs new rows (axis 2) that the host writes at the
    token's position (K/V, ``shape`` has ``max_seq_len`` rows); ``"ring"`` = the same rows written
    at slot ``position % ring`` of a ``ring``-row buffer (a sliding-window layer's K/V, see
    :func:`with_rings`); ``"replace"`` = the model outputs the whole next state, which replaces the
    input (conv windows, SSM / linear-attention states)."""

    kind: str  # "key", "value", "indexer" (written at positions), "conv", "recurrent" (replaced)
    layer: int
    index: int  # transformers' state_idx (a layer may hold several conv / recurrent states)
    shape: tuple
    carry: str
    #: ``carry="position"``: the axis of ``shape`` that holds the positions: 2 (``[1, H, S, D]``, as the
    #: model hands its rows over), or 3 for a value cache kept transposed (``[1, H, D, S]``,
    #: :meth:`transposed`); the model's new-row output is ``[1, H, 1, D]`` either way
    axis: int = 2

    def transposed(self) -> "State":
        """This position-carried state kept as ``[1, H, D, S]``: onert's BATCH_MATMUL reads a value
        cache in that layout as it is, and copies (transposes) one in ``[1, H, S, D]`` on every
        decode step (``dialect/attention.py``)."""
        b, h, rows, d = self.shape
        return State(self.kind, self.layer, self.index, (b, h, d, rows), self.carry, axis=3)

    @property
    def rows_shape(self) -> tuple:
        """``shape`` with the positions on axis 2 (what the model's own tensors look like)."""
        if self.axis == 3:
            b, h, d, rows = self.shape
            return (b, h, rows, d)
        return self.shape

    def as_rows(self, t):
        """The input tensor ``t`` of this state as the model reads it (positions on axis 2)."""
        return t.transpose(2, 3) if self.axis == 3 else t

    def written(self, t, rows, index):
        """``t`` (this state's buffer, eager) with the model's ``rows`` [1, H, n, D] written at
        positions ``index`` (a 1-D long tensor), as the host writes them."""
        if self.axis == 3:
            return t.index_copy(3, index, rows.transpose(2, 3))
        return t.index_copy(2, index, rows)

    #: ``carry == "ring"``: the buffer's rows (the window minus the token's own row), else None
    ring: int | None = None

    @property
    def key(self) -> tuple:
        return (self.kind, self.layer, self.index)

    @property
    def positional(self) -> bool:
        """Are the outputs new rows along axis 2 (at the position, or at its ring slot)?"""
        return self.carry in (AT_POSITION, RING)

    def slot(self, position: int) -> int:
        """The cache row the row of ``position`` is written at."""
        return position % self.ring if self.carry == RING else position

    def _suffix(self) -> str:
        return f"{self.layer}" + (f"_{self.index}" if self.index else "")

    @property
    def name(self) -> str:
        """The model input (and the host's buffer): ``key_cache_3``, ``conv_cache_0``, ``recurrent_cache_2_1``."""
        return f"{self.kind}_cache_{self._suffix()}"

    @property
    def output(self) -> str:
        """The model output holding the new rows / the next state: ``key_3``, ``conv_0``."""
        return f"{self.kind}_{self._suffix()}"


_ORDER = {"key": 0, "value": 1, "indexer": 2, "conv": 3, "recurrent": 4}
#: the states whose new rows the host writes at the token's position (axis 2 of a [1, H, S, D] buffer)
POSITIONAL = ("key", "value", "indexer")


def probe_caches(model, spec) -> list[State]:
    """Run the prefill wrapper once in eager (a prompt of zeros) and read every state each
    layer hands to the cache; the shapes of the traced models' state inputs and outputs
    follow from it (K/V: ``max_seq_len`` rows; other states: as handed over)."""
    with torch.no_grad():
        _, cache = Prefill(model, spec).run_cache(torch.zeros(1, spec.prefill_len, dtype=torch.int32),
                                               torch.zeros(1, dtype=torch.int32))
    out = []
    for (kind, layer, index), t in sorted(cache.new.items(), key=lambda kv: (kv[0][1], kv[0][2], _ORDER[kv[0][0]])):
        if kind in POSITIONAL:
            out.append(State(kind, layer, index, (1, int(t.shape[1]), spec.max_seq_len, int(t.shape[3])), AT_POSITION))
        else:
            out.append(State(kind, layer, index, tuple(int(d) for d in t.shape), REPLACE))
    return out


def sliding_layers(config, spec) -> set[int]:
    """The layers whose attention is bounded by ``spec.sliding_window``: those of type
    ``sliding_attention``, or every layer of a model with a window and no layer types (Mistral)."""
    if not spec.sliding_window:
        return set()
    kinds = layer_kinds(config)
    if kinds is None:
        return set(range(spec.num_layers))
    return {i for i, k in enumerate(kinds) if k == "sliding_attention"}


def ring_rows(spec) -> int | None:
    """The rows of a sliding layer's ring cache, or None when it keeps ``max_seq_len`` rows.

    transformers' window (``masking_utils.sliding_window_overlay``, the mask of every family's
    ``sliding_attention`` layers and of Mistral's: key ``k`` visible from query ``q`` iff
    ``q - window < k <= q``) is the token itself and the ``window - 1`` positions before it, so
    a decode step, which appends the token's own row to the cache, needs ``window - 1`` cached
    rows (transformers' ``DynamicSlidingWindowLayer`` keeps as many). No ring when ``window >=
    max_seq_len`` (nothing to save), or ``window < 2`` (nothing to cache)."""
    W = spec.sliding_window
    if not W or W >= spec.max_seq_len or W < 2:
        return None
    return W - 1


def with_rings(config, spec, caches: list) -> list:
    """``caches`` with each sliding-window layer's K/V (:func:`sliding_layers`) as a ring of
    :func:`ring_rows` rows: the host writes the row of position ``p`` at slot ``p % rows``
    (manifest ``carry: "ring"``) and the decode step reads the ring with the mask of
    :class:`DecodeStep` (a slot is visible once written: every written slot holds a position in
    the window). Attention over a ring is exact because the keys are cached after RoPE and
    softmax does not care about the order of the keys; a model whose attention reads the key's
    slot (``spec.kv_in_place``, MPT's ALiBi) keeps full caches."""
    R = ring_rows(spec)
    if R is None or spec.kv_in_place:
        return list(caches)
    layers = sliding_layers(config, spec)
    return [State(c.kind, c.layer, c.index, (*c.shape[:2], R, *c.shape[3:]), RING, ring=R)
            if c.kind in ("key", "value") and c.carry == AT_POSITION and c.layer in layers else c for c in caches]


#: the window :func:`rings_check` runs at: a ring of 2 rows, which its 8 decode steps wrap 3 times
CHECK_WINDOW = 3


def rings_check(model, spec, full_caches) -> bool:
    """Do ring caches give the model's own logits where the ring wraps? (In eager, before capture.)
    The export's self-check (:func:`decode_matches_prefill`, 8 positions) wraps no ring of a real
    window (512, 4096), so the same check runs here on a copy of ``spec`` whose window is
    :data:`CHECK_WINDOW`: decode steps over rings of ``CHECK_WINDOW - 1`` rows against the
    whole-prompt forward, both masked with that window, through the model's own code. A model whose
    attention reads the key's slot or the number of keys (a bias by key index) fails it and keeps
    ``max_seq_len`` rows (export_llm warns). Tolerance as :func:`decode_self_check`'s (1e-3 of the
    logits' scale): a key missing from or added to a window changes the logits by far more."""
    small = replace(spec, sliding_window=CHECK_WINDOW, caches=list(full_caches))
    small.caches = with_rings(model.config, small, small.caches)
    if not any(c.carry == RING for c in small.caches):
        return True
    for length_input in (True, False):  # False: a model that takes the cache length as a Python number
        try:
            return decode_matches_prefill(model, small, past_length_input=length_input, tol=1e-3)
        except Exception:
            continue
    return False


def slot_dependent(model, spec) -> bool:
    """Does the decode step's output depend on the key slot the new K/V row sits in? Run in
    eager once with the new row appended after the cache and once written at its position,
    on the same random cache: a model that reads only positions and the mask gives the same
    logits (up to rounding); one whose attention uses the key's slot does not (MPT slices its
    ALiBi bias by key length, so the appended row would sit S - position slots away)."""
    gen = torch.Generator().manual_seed(0)
    caches = [torch.randn(c.shape, generator=gen, dtype=spec.torch_dtype) if c.positional
              else torch.zeros(c.shape, dtype=spec.torch_dtype) for c in spec.caches]
    if not any(c.positional for c in spec.caches) or spec.max_seq_len < 2:
        return False
    ids = torch.full((1, 1), min(3, spec.vocab_size - 1), dtype=torch.int32)
    pos = torch.tensor([spec.max_seq_len // 2], dtype=torch.int32)
    with torch.no_grad():
        a, b = (DecodeStep(model, spec, past_length_input=False, in_place=p)(ids, pos, caches)["logits"]
                for p in (False, True))
    return not torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(a.abs().max()))


def _random_ids(spec, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    lo = min(3, spec.vocab_size - 1)  # tiny configs' pad / bos / eos ids are 0..2
    return torch.randint(lo, spec.vocab_size, (1, n), generator=gen, dtype=torch.int64).to(torch.int32)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    return bool((a - b).abs().max() <= tol * max(float(b.abs().max()), 1.0))


def decode_matches_prefill(model, spec, past_length_input: bool, tol: float = 1e-5) -> bool:
    """Does the decode step give the logits a whole-prompt forward gives? In eager, decode
    steps from position 0 to ``q`` on random ids (states carried as the host carries them)
    against the :class:`Prefill` wrapper over the same ``q + 1`` ids, whose positions and
    mask are constants and whose cache is empty (``get_seq_length`` 0 is true there). Used
    when the decode step cannot answer ``get_seq_length`` with the run-time position: a model
    that derives its positions from that length as a Python number (MVP's and RoFormer's
    ``arange(cache_length, ...)``, TrOCR's) then sees position 0 in every step and fails this;
    one that is given ``position_ids`` (GIT) or reads the length for a slice only (MPT) passes.
    ``tol`` is relative to the logits' scale. For that choice it is tight (1e-5): exact decoders
    differ from the prefill by rounding (~2e-7 on tiny random models), while RoFormer's rotary
    positions at 0 change its tiny random model's logits by only ~7e-5 (and its tokens not at all)."""
    q = min(7, spec.max_seq_len - 1)
    ids = _random_ids(spec, q + 1, seed=1)
    states = {c.key: torch.zeros(c.shape, dtype=spec.torch_dtype) for c in spec.caches}
    step = DecodeStep(model, spec, past_length_input=past_length_input)
    with torch.no_grad():
        for p in range(q + 1):
            out = step(ids[:, p:p + 1], torch.tensor([p], dtype=torch.int32), [states[c.key] for c in spec.caches])
            for c in spec.caches:
                states[c.key] = out[c.output] if c.carry == REPLACE else c.written(
                    states[c.key], out[c.output], torch.tensor([c.slot(p)]))
        want = Prefill(model, spec, length=q + 1)(ids, torch.tensor([q], dtype=torch.int32))["logits"]
    return _close(out["logits"], want, tol=tol)


def decode_self_check(model, spec, past_length_input: bool) -> str | None:
    """Why a cached decode step of ``model`` would not be exact, or None; in eager, before
    anything is exported:

    - two identical decode steps must give the same logits: a model that keeps state in its
      own modules instead of the cache (RecurrentGemma's recurrent layers) advances it on every
      call, and the exported graph would hold that state as a constant;
    - decode steps from position 0 must give the logits of a whole-prompt forward
      (:func:`decode_matches_prefill`, within 1e-3 of the logits' scale: loose, so rounding in a
      large real model never sends it off the cache; the state errors it exists for are
      0.1-1, e.g. Zaya's)."""
    gen = torch.Generator().manual_seed(4)
    caches = [torch.randn(c.shape, generator=gen, dtype=spec.torch_dtype) * 0.1 for c in spec.caches]
    ids = _random_ids(spec, 1, seed=5)
    pos = torch.tensor([min(2, spec.max_seq_len - 1)], dtype=torch.int32)
    step = DecodeStep(model, spec, past_length_input=past_length_input)
    with torch.no_grad():
        first, again = (step(ids, pos, [c.clone() for c in caches])["logits"] for _ in range(2))
    if not _close(again, first, tol=1e-6):
        return ("its forward keeps state outside the cache (two identical decode steps give different logits), "
                "which an exported decode step would freeze")
    if not decode_matches_prefill(model, spec, past_length_input, tol=1e-3):
        return "its decode steps through the cache do not give a whole-prompt forward's logits (checked in eager)"
    return None


def causal(model, spec) -> bool:
    """Are the logits at a position independent of the tokens after it? (In eager: two windows
    equal up to the middle and different after it.) A model that recomputes its whole window
    each step (:attr:`~circle_fx.llm.export.LLMSpec.recompute`) right-pads it, which is exact
    only if no token attends to later ones (XLNet's default two-way attention does)."""
    n = min(spec.max_seq_len, 8)
    a, b = _random_ids(spec, n, seed=2), _random_ids(spec, n, seed=3)
    k = max(n // 2 - 1, 0)
    b[:, :k + 1] = a[:, :k + 1]
    window, last = Prefill(model, spec, length=n), torch.tensor([k], dtype=torch.int32)
    with torch.no_grad():
        return _close(window(b, last)["logits"], window(a, last)["logits"])


def layer_kinds(config) -> list[str] | None:
    """``config.layer_types`` if the model builds one mask per layer type (a dict)."""
    kinds = getattr(config, "layer_types", None)
    return list(kinds) if kinds else None


def _as_mask(visible: torch.Tensor, float_mask: bool, dtype) -> torch.Tensor:
    """bool mask for SDPA; an additive float mask for the eager attention implementation."""
    if not float_mask:
        return visible
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.full((), torch.finfo(dtype).min, dtype=dtype))


#: layer types whose layers attend (and take a 4-D mask); the model's other layer types
#: (state layers: ``conv``, ``linear_attention``, ...) take transformers' 2-D padding mask,
#: which is None here: prefill is never padded for models with such state (``State``)
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention", "indexed_attention")
#: ``hybrid``: attention and an SSM side by side in one layer (Falcon-H1), which reads
#: ``mask["full_attention"]`` and ``mask["linear_attention"]``
STATE_KINDS = ("conv", "linear_attention", "mamba", "hybrid")
#: layers that hold no state and take no mask (Nemotron-H's MLP / MoE layers)
STATELESS_KINDS = ("mlp", "moe")


def _masks(config, visible_full, visible_sliding, float_mask, dtype, visible_chunked=None):
    kinds = layer_kinds(config)
    if kinds is not None and not set(kinds) & {*ATTENTION_KINDS, "hybrid"}:
        return None  # no layer attends (Mamba): no 4-D mask; no padding, so no 2-D one either
    if kinds is None:  # one mask for every layer (sliding when the config has a window, e.g. Mistral)
        return _as_mask(visible_sliding, float_mask, dtype)
    # state layers' 2-D padding masks (also under the keys a hybrid layer reads); export_llm
    # has rejected the kinds it cannot drive
    out = {kind: None for kind in (*kinds, *STATE_KINDS, *STATELESS_KINDS)}
    out["full_attention"] = _as_mask(visible_full, float_mask, dtype)
    if "sliding_attention" in kinds:
        out["sliding_attention"] = _as_mask(visible_sliding, float_mask, dtype)
    if "chunked_attention" in kinds:
        out["chunked_attention"] = _as_mask(visible_chunked, float_mask, dtype)
    if "indexed_attention" in kinds:  # causal; the indexer's top-k selection is the model's own
        out["indexed_attention"] = out["full_attention"]
    return out


def _call(model, spec, cache, logits_to_keep=None, **kwargs):
    """The model's own ``forward`` -> logits. A model that recomputes its window
    (:attr:`~circle_fx.llm.export.LLMSpec.recompute`: its forward takes no cache, or export_llm
    cannot drive it through one) is called with ``input_ids`` alone, as ``circle_fx.export``
    calls it: its own causal mask and positions ``0..n-1``, no cache. A forward
    without ``logits_to_keep`` (TrOCR, Whisper's decoder) computes every position's logits and
    the one asked for is picked here, as transformers picks it (``logits[:, index, :]``)."""
    params = spec.forward_params
    if spec.recompute:
        kwargs = {"input_ids": kwargs["input_ids"]}
    else:
        kwargs[spec.cache_kw] = cache
    if "use_cache" in params:
        kwargs["use_cache"] = not spec.recompute
    pick = logits_to_keep is not None and "logits_to_keep" not in params
    if logits_to_keep is not None and not pick:
        kwargs["logits_to_keep"] = logits_to_keep
    logits = model(**kwargs).logits
    return logits[:, logits_to_keep, :] if pick else logits


class DecodeStep(torch.nn.Module):
    """One token: ``(input_ids [1,1], position [1], key_cache_0, value_cache_0, conv_cache_1, ...)``
    -> ``{"logits": [1,1,V], "key_0": [1,Hkv,1,D], "value_0": ..., "conv_1": next state, ...}``."""

    def __init__(self, model, spec, past_length_input: bool = True, in_place: bool | None = None,
                 rows: int | None = None):
        super().__init__()
        self.model, self.spec = model, spec
        # True: GraphCache.get_seq_length answers ``position``; False: 0 (see there)
        self.past_length_input = past_length_input
        self.in_place = spec.kv_in_place if in_place is None else in_place
        # a cache-length bucket (export_llm's decode buckets): the step takes the whole
        # max_seq_len caches (every bucket of the package binds the same buffers) but reads
        # only their first ``rows`` rows (a STRIDED_SLICE), so a step at a position < rows
        # attends over rows + 1 keys instead of max_seq_len + 1; exact for those positions
        self.bucket = S = spec.max_seq_len if rows is None else rows
        C = spec.attention_chunk or 1
        # Key slot j is position j for the cache rows 0..S-1. The new row is appended as slot S
        # (a CONCATENATION, the default), or, when the model's attention depends on the key's
        # slot (MPT's ALiBi bias, sliced by key length: ``slot_dependent``), written at
        # ``position`` (a SELECT over the whole cache: on a cache-heavy toy Llama, measured under load,
        # 0-10 % slower than the CONCATENATION a step, so only when needed).
        # lo[j] < position hides unwritten / future rows; hi[j] > position - window is the
        # sliding-window bound; position < chunk_end[j] (the end of row j's chunk) keeps the rows
        # of the position's own chunk (chunked attention, Llama 4). An appended new row passes all.
        rows, ends = torch.arange(S), (torch.arange(S) // C + 1) * C
        lo, hi = (rows - 1, rows) if self.in_place else (
            torch.cat([rows, torch.tensor([-1])]), torch.cat([rows, torch.tensor([2 * S + 1])]))
        ends = ends if self.in_place else torch.cat([ends, torch.tensor([2 * S + 1])])
        self.register_buffer("rows", rows.to(torch.int32), persistent=False)
        self.register_buffer("lo", lo.to(torch.int32), persistent=False)
        self.register_buffer("hi", hi.to(torch.int32), persistent=False)
        self.register_buffer("chunk_end", ends.to(torch.int32), persistent=False)
        # sliding-window layers with ring caches (:func:`with_rings`, never in place): slot s of R
        # rows holds position p - 1 - ((p - 1 - s) mod R), the latest position before p written
        # there, which is >= p - R > p - window: in the window whenever it is written, and slot s is
        # written once p > s. So slot s is visible iff s < position, like a full cache's row s; the
        # appended new row (slot R) always. A bucket of B < R rows reads slots 0..B-1: a position
        # < B has written no slot past them.
        ring = next((c.ring for c in spec.caches if c.carry == RING), None)
        self.ring = None if ring is None else min(ring, S)
        if self.ring is not None:
            self.register_buffer("ring_lo", torch.cat([torch.arange(self.ring), torch.tensor([-1])]).to(torch.int32),
                                 persistent=False)

    def forward(self, input_ids, position, caches):
        spec, L = self.spec, self.spec.num_layers
        if self.bucket < spec.max_seq_len:
            caches = [(t[..., :self.bucket] if c.axis == 3 else t[:, :, :self.bucket, :]) if c.carry == AT_POSITION else
                      t[:, :, :self.bucket, :] if c.carry == RING and self.bucket < c.ring else t
                      for c, t in zip(spec.caches, caches)]
        caches = [c.as_rows(t) for c, t in zip(spec.caches, caches)]  # a transposed V cache: read as rows
        write_at = (self.rows == position).view(1, 1, -1, 1) if self.in_place else None
        cache = GraphCache(L, {c.key: t for c, t in zip(spec.caches, caches)},
                           position if self.past_length_input else 0, write_at=write_at)
        full = self.lo < position
        if self.ring is not None:
            sliding = self.ring_lo < position
        elif spec.sliding_window:
            sliding = full & (self.hi > position - spec.sliding_window)
        else:
            sliding = full
        chunked = full & (self.chunk_end > position) if spec.attention_chunk else full
        shape = (1, 1, 1, -1)
        mask = _masks(self.model.config, full.view(shape), sliding.view(shape), spec.float_mask, spec.torch_dtype,
                      chunked.view(shape))
        logits = _call(self.model, spec, cache, input_ids=input_ids, position_ids=position.view(1, 1),
                       attention_mask=mask)
        return _outputs(logits, cache, spec)


class Prefill(torch.nn.Module):
    """A prompt padded to ``prefill_len`` (or ``length``) starting at position 0:
    ``(input_ids [1,P], last_index [1])`` -> ``{"logits": [1,1,V] at last_index,
    "key_0": [1,Hkv,P,D], ...}``. Right padding never changes the real tokens' results
    (causal mask), so no length input is needed beyond ``last_index``. With
    ``length=max_seq_len`` and no states it is also the decode model of a package that
    recomputes (:attr:`~circle_fx.llm.export.LLMSpec.recompute`)."""

    def __init__(self, model, spec, length: int | None = None, pad_to: int | None = None):
        super().__init__()
        self.model, self.spec = model, spec
        P = length or spec.prefill_len
        # a prefill bucket (export_llm's prefill buckets): it takes ``pad_to`` ids (the package's
        # longest prefill, so every bucket has the same inputs and outputs and one IF chain
        # switches them), computes only the first P, and pads its K/V rows back to ``pad_to``
        self.length, self.pad_to = P, pad_to
        self.register_buffer("positions", torch.arange(P, dtype=torch.int32).view(1, P), persistent=False)
        q = torch.arange(P).view(P, 1)
        k = torch.arange(P).view(1, P)
        causal = k <= q
        sliding = causal & (k > q - spec.sliding_window) if spec.sliding_window else causal
        C = spec.attention_chunk or P
        chunked = causal & (k // C == q // C)  # transformers' chunked_overlay, without padding
        self.register_buffer("causal", causal.view(1, 1, P, P), persistent=False)
        self.register_buffer("sliding", sliding.view(1, 1, P, P), persistent=False)
        self.register_buffer("chunked", chunked.view(1, 1, P, P), persistent=False)

    def run_cache(self, input_ids, last_index):
        cache = GraphCache(self.spec.num_layers)
        mask = _masks(self.model.config, self.causal, self.sliding, self.spec.float_mask, self.spec.torch_dtype,
                      self.chunked)
        logits = _call(self.model, self.spec, cache, input_ids=input_ids, position_ids=self.positions,
                       attention_mask=mask, logits_to_keep=last_index)
        return logits, cache

    def forward(self, input_ids, last_index):
        if self.pad_to is not None and self.pad_to > self.length:
            input_ids = input_ids[:, :self.length]
        logits, cache = self.run_cache(input_ids, last_index)
        out = _outputs(logits, cache, self.spec)
        if self.pad_to is not None and self.pad_to > self.length:
            for c in self.spec.caches:
                if c.positional:
                    out[c.output] = torch.nn.functional.pad(out[c.output], (0, 0, 0, self.pad_to - self.length))
        return out


def _outputs(logits, cache: GraphCache, spec) -> dict:
    """``logits`` and each state's output (:attr:`State.output`): the new K/V rows, the next
    conv / recurrent states."""
    result = {"logits": logits}
    for c in spec.caches:
        result[c.output] = cache.new[c.key]
    return result
