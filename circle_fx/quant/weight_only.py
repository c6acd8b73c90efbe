"""The ``quantize_weights`` pass: linear weights -> int8 rows or GGML Q8_0/Q4_0 blocks, embedding
tables -> uint8 rows or a GGML Q4_0 table.

``int8`` linears with many static rows (``QuantConfig.blocks_from_rows``, 16: an LLM's prefill)
become Q8_0 blocks, ggml's kernel being twice as fast as onert's hybrid int8 FC there (measured).

GGML modes (``QuantConfig(weights="q8_0"|"q4_0")``) rewrite linears to ``circle.linear_ggml`` and,
with ``embedding="q4_0"``, embeddings to ``circle.embedding_ggml`` (blocks packed by
:mod:`circle_fx.quant.ggml`). A linear whose in_features is not a multiple of 32, or whose input
has a dynamic dim, falls back to int8 rows (recorded in ``summary()``). The lm_head (tied to the
embedding, or named ``lm_head``) follows ``QuantConfig.lm_head``.

For every constant weight it computes, once and at compile time, int8 values with one
symmetric scale per output row (``scale = max|row| / 127``), and rewrites its users:
``aten.linear`` -> ``circle.linear_w8``, ``aten.embedding`` -> ``circle.embedding_w8``
(see :mod:`circle_fx.dialect.weights`); a ``circle.linear_act`` (a linear with the ReLU / ReLU6 the
``linear_activation`` family fused) is a linear too and keeps its activation. The float weight is then unused and dropped by DCE, so
the graph never holds a float and a quantized copy of the same weight side by side; the
rows are quantized in chunks of ~4 MiB, so no full-size float temporary exists either.

How the file encodes it (onert 0.1.0, measured; ``docs/onert-findings.md``): the int8
weight carries a per-tensor scale of 1.0 (onert's hybrid FULLY_CONNECTED silently uses only
``scale[0]`` of per-channel scales) and a MUL by the per-row scales follows; an embedding-only
table is stored as ``q + 128`` (uint8, zero point 128: GATHER rejects int8 tables).

Tied weights (one tensor used by a linear and an embedding: Llama's ``lm_head`` ==
``embed_tokens``) stay one int8 buffer: the embedding reads it through a uint8 view and
fixes the sign after DEQUANTIZE (see the lowering), so the file holds the table once.

Convolutions (``circle.conv2d_nhwc``, what the NHWC decompositions and the Conv+BN / Conv+ReLU
families leave) follow ``QuantConfig.weights`` or an override, as linears do: any mode quantizes
their 4-D weight to int8 with one symmetric scale per output channel (GGML blocks have no
convolution kernel) and rewrites them to ``circle.conv2d_w8``: onert's hybrid CONV_2D / DEPTHWISE_CONV_2D apply
per-channel scales correctly (``benchmarks/onert_conv_int8.py``), unlike its hybrid FC.

A weight is left float, with the reason recorded, when a skip pattern matches it, when it
has a user that is neither a linear (as weight) nor an embedding (as table) — quantizing
it would mean keeping a float copy too — or when it is tied to a use the config keeps float.
"""
from __future__ import annotations

import fnmatch
import operator
import re
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx as fx

from ..meta import CONSTANT_NAMES, QUANT_META
from ..circle.schema import QuantParams
from ..errors import InputError
from ..fx_utils import arguments, fake_constant, make_node
from ..pass_protocol import Pass
from ..lazy import is_lazy
from ..program import StackedTensor, add_constant, row_chunks
from .config import QuantConfig
from ..circle import ggml
from .config import GGML_MODES, SENSITIVE_LINEARS
from .ggml import mapped_empty, pack as ggml_pack
from ..dialect.nhwc import conv2d_nhwc
from ..fusions.linear_activation import linear_act
from ..dialect.weights import conv2d_w8, embedding_ggml, embedding_w8, linear_ggml, linear_w8

aten = torch.ops.aten

#: the zero point of an embedding-only table stored as ``q + 128``
UINT8_ZERO_POINT = 128

_CHUNK_BYTES = 4 << 20


@dataclass
class QuantizationRecord:
    """What the pass did, for ``summary()``: quantized weights and the ones left float."""

    config: QuantConfig
    quantized: list[tuple[str, str, tuple, str]] = field(default_factory=list)  # (name, uses, shape, dtype)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (name, "q4_0 -> int8: why")
    notes: list[str] = field(default_factory=list)
    #: stored bytes and weight count per encoding (``{"q4_0": [bytes, weights]}``): bits per weight
    sizes: dict = field(default_factory=dict)
    #: Q4_0 blocks' total squared error: [ggml's plain d = m/-8, the searched scale]
    q4_err: list = field(default_factory=lambda: [0.0, 0.0])
    #: ``QuantConfig.overrides`` pattern -> the weights it decided (first match wins), in graph order
    overridden: dict = field(default_factory=dict)
    #: the weights ``QuantConfig.sensitive`` decided
    sensitive: list = field(default_factory=list)
    #: int8 linear weights stored as q8_0 because of their row count (``QuantConfig.blocks_from_rows``)
    by_rows: list = field(default_factory=list)
    #: Q4_0 linear weights whose scales were weighted by ``QuantConfig.importance`` / had none there
    weighted: list = field(default_factory=list)
    unweighted: list = field(default_factory=list)
    #: of the weighted ones, those packed from GPTQ's rounding (``Importance.rounding``) / not (their
    #: weight changed after calibration, or GPTQ did not measure it): the weighted scale search
    gptq: list = field(default_factory=list)
    not_gptq: list = field(default_factory=list)

    def add(self, name, linears, embeddings, shape, encoding, nbytes) -> None:
        kinds = "+".join(k for k, users in (("linear", linears), ("embedding", embeddings)) if users)
        self.quantized.append((name, kinds, shape, encoding))
        size = self.sizes.setdefault(encoding, [0, 0])
        size[0] += nbytes
        size[1] += shape[0] * shape[1]

    def bits_per_weight(self) -> dict[str, float]:
        """Stored bits per quantized weight, per encoding (scales included)."""
        return {k: 8 * b / n for k, (b, n) in self.sizes.items() if n}

    def encodings(self) -> dict[str, str]:
        """Weight name (``.weight`` dropped; a merged weight's members joined by ``+``) -> its stored
        encoding (``q4_0``, ``q8_0``, ``int8``, ``uint8``); a tied weight stored once per encoding
        reads ``"q8_0+uint8"``. For the LLM package manifest."""
        out: dict[str, str] = {}
        for name, _, _, dtype in self.quantized:
            key = display_name(name)
            out[key] = f"{out[key]}+{dtype}" if key in out else dtype
        return out

    def override_lines(self) -> list[str]:
        """One line per ``QuantConfig.overrides`` pattern: its mode and the linears it set; one for
        ``QuantConfig.sensitive`` and one for ``QuantConfig.importance`` when set."""
        out = [f"override {p!r} -> {m or 'float'}: {len(self.overridden.get(p, ()))} linear(s): "
               f"{compact_names(self.overridden.get(p, ()))}" for p, m in self.config.overrides]
        if self.config.sensitive:
            out.append(f"sensitive -> {self.config.sensitive}: {len(self.sensitive)} linear(s): "
                       f"{compact_names(self.sensitive)}")
        out += self.calibration_lines()
        return out

    def calibration_lines(self) -> list[str]:
        """What the Q4_0 scales were calibrated on (``QuantConfig.importance``'s source), or why they
        were not; nothing when no weight is Q4_0."""
        cfg = self.config
        if cfg.importance is not None:
            source = getattr(cfg.importance, "source", None)
            how = (f" ({len(self.gptq)} rounded by GPTQ on the same samples"
                   + (f"; {len(self.not_gptq)} by the weighted search: {compact_names(self.not_gptq)}"
                      if self.not_gptq else "") + ")") if self.gptq or self.not_gptq else ""
            return [f"q4_0 scales weighted by activation importance: {len(self.weighted)} weight(s)" + how
                    + (f", calibrated on {source}" if source else "")
                    + (f"; none given for {len(self.unweighted)} (plain search): {compact_names(self.unweighted)}"
                       if self.unweighted else "")]
        if not any(dtype == "q4_0" and "linear" in kind for _, kind, _, dtype in self.quantized):
            return []
        why = cfg.calibration_note or ("not calibrated: QuantConfig(calibration=None)" if cfg.calibration is None
                                       else "not calibrated")
        return [f"q4_0 scales: {why} (plain scale search)"]

    def lines(self) -> list[str]:
        uses: dict[str, int] = {}
        for _, kind, _, dtype in self.quantized:
            uses[f"{kind} -> {dtype}"] = uses.get(f"{kind} -> {dtype}", 0) + 1
        out = [f"quantized weights: {len(self.quantized)} (" + ", ".join(f"{k} x{v}" for k, v in uses.items()) + ")"]
        out.append("bits per weight: " + ", ".join(f"{k} {v:.2f}" for k, v in self.bits_per_weight().items()))
        plain, chosen = self.q4_err
        if plain > 0:
            how = " (importance-weighted)" if self.weighted else ""
            out.append(f"q4_0 scale search: squared error{how} {100 * (1 - chosen / plain):.1f}% lower than "
                       f"ggml's max/-8 scale")
        out += [f"  {line}" for line in self.override_lines()]
        if self.by_rows:
            out.append(f"  int8 -> q8_0 for >= {self.config.blocks_from_rows} rows (QuantConfig.blocks_from_rows): "
                       f"{len(self.by_rows)} linear(s): {compact_names(self.by_rows)}")
        out += [f"  fallback: {name}: {why}" for name, why in self.fallbacks]
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  kept float: {name}: {why}" for name, why in self.skipped]
        return out


def quantize_rows(w: torch.Tensor, unsigned: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: ``(q, scale)`` with ``w ~= q * scale[:, None]``, ``|q| <= 127``.

    ``unsigned`` stores ``q + 128`` as uint8 (zero point 128). Works through the rows in
    chunks of ~4 MiB, so the only full-size allocation is the 1-byte result. An all-zero
    row gets scale 1 (scales must be positive for the file; its values are 0 either way).
    numpy, not torch: its min/max/rint run 5-10x faster here (torch.round and aminmax
    dominated the conversion time of a 125M model). Raises ValueError on inf/nan.
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    rows, cols = w.shape
    q = mapped_empty((rows, cols), np.uint8 if unsigned else np.int8)
    scale = np.empty(rows, dtype=np.float32)
    step = max(1, _CHUNK_BYTES // max(1, cols * 4))
    with torch.no_grad():
        for i, part in row_chunks(w, step):  # a merged weight part by part, never concatenated
            block = part.to(torch.float32).numpy()
            n = len(block)
            amax = np.maximum(block.max(axis=1), -block.min(axis=1))
            if not np.isfinite(amax).all():
                raise ValueError(f"row {i + int(np.argmin(np.isfinite(amax)))} has non-finite values (inf/nan)")
            s = amax / np.float32(127)
            s = np.where(s > 0, s, np.float32(1))
            r = block / s[:, None]  # the one chunk-sized float temporary; the rest in place
            np.rint(r, out=r)
            np.clip(r, -127, 127, out=r)
            if unsigned:
                r += 128
            q[i:i + n] = r
            scale[i:i + n] = s
    return torch.from_numpy(q), torch.from_numpy(scale)


def _uses(attr: fx.Node):
    """``(linears, embeddings, others)``: the users reading ``attr`` as a linear weight (a plain
    linear, or one with a fused activation: ``circle.linear_act``), as an embedding table, and
    in any other way."""
    linears, embeddings, others = [], [], []
    for user in attr.users:
        if user.target in (aten.linear.default, linear_act) and len(user.args) > 1 and user.args[1] is attr \
                and attr not in user.args[:1] + user.args[2:]:
            linears.append(user)
        elif user.target is aten.embedding.default and user.args[0] is attr and attr not in user.args[1:]:
            embeddings.append(user)
        else:
            others.append(user)
    return linears, embeddings, others


class QuantizeWeights(Pass):
    """Weight-only int8 quantization (see the module docstring)."""

    name = "quantize_weights"

    def __init__(self, config: QuantConfig | None = None, cache: dict | None = None):
        super().__init__()
        self.config = config or QuantConfig()
        #: weight identity -> its quantized arrays, shared by lowerings of one model's weights
        #: (export_llm's decode and prefill programs): each weight is packed once, and both
        #: files' builders reference the same arrays instead of two equal copies
        self.cache = cache if cache is not None else {}

    def _once(self, w, how: str, compute):
        """``compute()`` for weight ``w`` encoded ``how``, or the result computed before for the same
        storage (the captured constants of one model are views of its parameters)."""
        parts = w.parts if isinstance(w, StackedTensor) else [w]
        key = (how, tuple(p.key if is_lazy(p) else
                          (p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape), tuple(p.stride()))
                          for p in parts))
        if key not in self.cache:
            self.cache[key] = (compute(), parts)  # the parts kept alive: their addresses stay theirs
        return self.cache[key][0]

    def run(self, program) -> bool:
        cfg = self.config
        gm, g = program.gm, program.graph
        names = gm.meta.get(CONSTANT_NAMES, {})
        record = QuantizationRecord(cfg)
        matched = set()
        changed = False
        attrs = [n for n in g.nodes if n.op == "get_attr"]
        self._layers = 1 + max((i for i in (_layer_index(names.get(a.target, a.target)) for a in attrs
                                            if _uses(a)[0]) if i is not None), default=-1)
        for attr in attrs:
            w = program.constant(attr)
            if not isinstance(w, torch.Tensor) or w.dtype != torch.float32:
                continue
            conv = w.dim() == 4 and _conv_uses(attr)
            if not conv:
                if w.dim() != 2:
                    continue
                linears, embeddings, others = _uses(attr)
                if not linears and not embeddings:
                    continue
            name = names.get(attr.target, attr.target)
            if self._skipped(name, record, matched):
                continue
            if conv:
                changed |= self._conv(program, attr, w, name, record)
                continue
            lin, emb = self._modes(w, name, linears, embeddings, record)
            reason = self._keep_float(lin, linears, embeddings, others)
            if reason:
                record.skipped.append((name, reason))
                continue
            self._rewrite(program, attr, w, linears, embeddings, record, name, lin, emb)
            changed = True
        unmatched = [p for p, _ in cfg.overrides if p not in record.overridden]
        if unmatched:
            raise InputError(f"QuantConfig(overrides=...): pattern(s) {unmatched} match no linear weight; "
                             "patterns are matched against parameter names such as 'lm_head.weight' "
                             "or module names such as 'model.layers.0.mlp.down_proj'")
        unmatched = [p for p in cfg.skip if p not in matched]
        if unmatched:
            raise InputError(f"QuantConfig(skip=...): pattern(s) {unmatched} match no quantizable weight; "
                             "patterns are matched against parameter names such as 'lm_head.weight' "
                             "or module names such as 'model.layers.0.mlp.down_proj'")
        program.quantization = record
        return changed

    def _skipped(self, name, record, matched) -> bool:
        """Does a ``QuantConfig.skip`` pattern keep weight ``name`` float? Recorded, as the patterns
        that matched something (an unmatched one is an error)."""
        hits = [p for p in self.config.skip if _matches(p, name)]
        if hits:
            matched.update(hits)
            record.skipped.append((name, f"matches skip pattern {hits[0]!r}"))
        return bool(hits)

    def _override(self, name, record) -> tuple[str, str | None] | None:
        """The first ``QuantConfig.overrides`` ``(pattern, mode)`` matching weight ``name``
        (recorded for ``summary()`` and the unmatched-pattern check), or None."""
        hit = next(((p, m) for p, m in self.config.overrides if _matches(p, name)), None)
        if hit:
            record.overridden.setdefault(hit[0], []).append(name)
        return hit

    def _conv(self, program, attr, w, name, record) -> bool:
        """Per-output-channel int8 for a weight only convolutions read (see the module docstring);
        its mode is ``QuantConfig.weights`` or an override's, as for a linear."""
        hit = self._override(name, record)
        mode = hit[1] if hit else self.config.weights
        if mode is None:
            record.skipped.append((name, f"override {hit[0]!r} keeps it float" if hit else
                                   "convolution weights follow QuantConfig.weights=None"))
            return False
        batches = {_batch(u) for u in attr.users}
        if None in batches:
            record.skipped.append((name, "a convolution with a dynamic batch: onert 0.1.0's hybrid int8 "
                                         "convolution corrupts memory at batch > 1 (docs/onert-findings.md)"))
            return False
        try:
            q, scale = quantize_rows(w.reshape(w.shape[0], -1))
        except ValueError as e:
            raise InputError(f"weight {name!r} cannot be quantized: {e}") from None
        if mode != "int8":
            record.fallbacks.append((name, f"{mode} -> int8 per channel: a convolution (no GGML convolution kernel)"))
        qn = self._constant(program, attr, q.reshape(w.shape), "q")
        sn = self._constant(program, attr, scale, "scale")
        for user in list(attr.users):
            x, _, bias, *rest = arguments(user)
            self._replace_per_sample(program.graph, user, _batch(user), (qn, sn, bias, *rest))
        record.quantized.append((name, "conv", tuple(w.shape), "int8"))
        size = record.sizes.setdefault("int8", [0, 0])
        size[0] += q.numel() + 4 * scale.numel()
        size[1] += q.numel()
        return True

    def _keep_float(self, lin_mode, linears, embeddings, others) -> str | None:
        cfg = self.config
        if others:
            ops = sorted({str(getattr(u.target, "__name__", u.target)) for u in others})
            return f"also read by {', '.join(ops)} (quantizing would keep a float copy as well)"
        if linears and embeddings and (lin_mode is None or cfg.embedding is None):
            return "shared by a linear and an embedding, and the config keeps one of them float"
        if linears and lin_mode is None:
            return "linear weights are kept float (QuantConfig.weights/lm_head=None)"
        if embeddings and not linears and cfg.embedding is None:
            return "embeddings are kept float (QuantConfig.embedding=None)"
        return None

    def _modes(self, w, name, linears, embeddings, record) -> tuple[str | None, str | None]:
        """``(linear mode, embedding mode)`` for this weight, after the fallbacks the file format
        needs: GGML blocks need ``in_features % 32 == 0`` and static shapes (else int8 rows), a
        Q4_0 table likewise (else uint8 rows)."""
        cfg = self.config
        lm_head = bool(embeddings) or _matches("*lm_head", name)
        lin = (cfg.lm_head_mode if lm_head else cfg.weights) if linears else None
        if linears and not lm_head and cfg.sensitive and self._sensitive(name):
            record.sensitive.append(name)
            lin = cfg.sensitive
        hit = self._override(name, record) if linears else None
        if hit:
            if record.sensitive[-1:] == [name]:
                record.sensitive.pop()
            lin = hit[1]
        emb = cfg.embedding if embeddings else None
        cols = w.shape[1]
        if lin in GGML_MODES:
            why = (f"in_features {cols} is not a multiple of {ggml.BLOCK}" if cols % ggml.BLOCK else
                   "a dynamic dim reaches it (the GGML kernels need static shapes)"
                   if any(_dynamic(u) for u in linears) else None)
            if why:
                record.fallbacks.append((name, f"{lin} -> int8: {why}"))
                lin = "int8"
        chosen = hit is not None or record.sensitive[-1:] == [name]  # an explicit int8 stays int8
        if lin == "int8" and not chosen and not embeddings and self._many_rows(linears) and cols % ggml.BLOCK == 0:
            record.by_rows.append(name)
            lin = "q8_0"
        if emb == "q4_0" and cols % ggml.BLOCK:
            record.fallbacks.append((name, f"q4_0 table -> uint8-rows: dim {cols} is not a multiple of {ggml.BLOCK}"))
            emb = "uint8-rows"
        return lin, emb

    def _many_rows(self, linears) -> bool:
        """Every linear reading the weight has a static row count >= ``blocks_from_rows``: the
        row counts where ggml's Q8_0 kernel beats onert's hybrid int8 one (``QuantConfig``)."""
        least = self.config.blocks_from_rows
        return least is not None and all(_rows(u) is not None and _rows(u) >= least for u in linears)

    def _sensitive(self, name: str) -> bool:
        """An MLP output projection (``SENSITIVE_LINEARS``), or a linear of the first or last
        ``end_layers`` layers."""
        if any(_matches(p, name) for p in SENSITIVE_LINEARS):
            return True
        i, k = _layer_index(name), self.config.end_layers
        return i is not None and k > 0 and (i < k or i >= self._layers - k)

    def _rewrite(self, program, attr, w, linears, embeddings, record, name, lin, emb) -> None:
        """Shared encodings (int8 + uint8 rows, q4_0 + q4_0) keep a tied weight one buffer;
        otherwise each use gets its own encoding."""
        if linears and embeddings and not ((lin, emb) in (("int8", "uint8-rows"), ("q4_0", "q4_0"))):
            record.notes.append(f"{name}: {lin} linear and {emb} embedding: stored once per encoding")
            self._rewrite(program, attr, w, linears, [], record, name, lin, None)
            self._rewrite(program, attr, w, [], embeddings, record, name, None, emb)
            return
        if (lin or emb) in GGML_MODES:
            return self._rewrite_ggml(program, attr, w, linears, embeddings, record, name, lin or emb)
        self._rewrite_int8(program, attr, w, linears, embeddings, record, name)

    def _constant(self, program, attr, t, suffix):
        g = program.graph
        with g.inserting_before(attr):
            n = g.get_attr(add_constant(program.gm, t, f"{attr.target}_{suffix}"))
        n.meta["val"] = fake_constant(g, t)
        return n

    def _rewrite_ggml(self, program, attr, w, linears, embeddings, record, name, kind) -> None:
        g = program.graph
        imp = self._importance(name, w, linears, kind, record)
        rounded = self._gptq(name, w, imp, record)
        try:
            blocks, err_plain, err_chosen = (rounded, 0.0, 0.0) if rounded is not None else self._once(
                w, kind if imp is None else f"{kind} importance",
                lambda: ggml_pack(w, ggml.BY_NAME[kind], importance=imp))
        except ValueError as e:
            raise InputError(f"weight {name!r} cannot be quantized: {e}") from None
        bn = self._constant(program, attr, blocks, kind)
        for user in linears:
            x, bias, act = _linear_args(user)
            self._replace(g, user, linear_ggml, (x, bn, kind, bias, *act))
        for user in embeddings:
            self._replace(g, user, embedding_ggml, (bn, kind, user.args[1]))
        record.add(name, linears, embeddings, tuple(w.shape), kind, blocks.numel())
        record.q4_err[0] += err_plain
        record.q4_err[1] += err_chosen

    def _importance(self, name, w, linears, kind, record):
        """``QuantConfig.importance``'s values for a Q4_0 weight read by linears (the lm_head's input
        weighs a tied table's blocks too: one set of blocks serves both uses), or None."""
        table = self.config.importance
        if table is None or kind != "q4_0" or not linears:
            return None
        imp = table.for_weight(name, int(w.shape[1]))
        (record.weighted if imp is not None else record.unweighted).append(name)
        return imp

    def _gptq(self, name, w, imp, record):
        """GPTQ's blocks for this Q4_0 linear weight from the calibration (``Importance.rounding``),
        or None: none measured, or ``w`` is no longer the weight they were computed from."""
        rounding = getattr(self.config.importance, "rounding", None)
        if imp is None or rounding is None:
            return None
        blocks = rounding.for_weight(name, w)
        (record.gptq if blocks is not None else record.not_gptq).append(name)
        return blocks

    def _rewrite_int8(self, program, attr, w, linears, embeddings, record, name) -> None:
        g = program.graph
        unsigned = not linears  # a table only GATHER reads: uint8, zero point 128
        try:
            q, scale = self._once(w, f"int8 unsigned={unsigned}", lambda: quantize_rows(w, unsigned=unsigned))
        except ValueError as e:
            raise InputError(f"weight {name!r} cannot be quantized: {e}") from None
        qn = self._constant(program, attr, q, "q")
        sn = self._constant(program, attr, scale, "scale")
        zero_point = UINT8_ZERO_POINT if unsigned else 0
        qn.meta[QUANT_META] = QuantParams(1.0, zero_point)
        for user in linears:
            x, bias, act = _linear_args(user)
            self._replace(g, user, linear_w8, (x, qn, sn, bias, *act))
        for user in embeddings:
            self._replace(g, user, embedding_w8, (qn, sn, zero_point, user.args[1]))
        record.add(name, linears, embeddings, tuple(w.shape), str(q.dtype).replace("torch.", ""),
                   q.numel() + 4 * scale.numel())

    @classmethod
    def _replace_per_sample(cls, g, user, batch: int, rest: tuple) -> None:
        """``user`` (a float convolution) as ``conv2d_w8`` once per sample, concatenated along
        the batch: onert 0.1.0's hybrid CONV_2D / DEPTHWISE_CONV_2D (int8 filter, float input)
        kills the process (SIGSEGV / SIGABRT) at any batch above 1 and runs correctly at batch 1
        (measured 2026-12-05: 1x1, 3x3 and depthwise, batches 2 and 3; docs/onert-findings.md).
        The filter is one constant either way; the cost is a SPLIT and a CONCATENATION."""
        x = user.args[0]
        if batch == 1:
            cls._replace(g, user, conv2d_w8, (x, *rest))
            return
        with g.inserting_before(user):
            parts = make_node(g, aten.split.Tensor, (x, 1, 0), like=user)
            outs = []
            for i in range(batch):
                xi = make_node(g, operator.getitem, (parts, i), like=user)
                outs.append(make_node(g, conv2d_w8, (xi, *rest), like=user))
            new = make_node(g, aten.cat.default, (outs, 0), like=user)
        user.replace_all_uses_with(new)
        g.erase_node(user)

    @staticmethod
    def _replace(g, user, target, args) -> None:
        with g.inserting_before(user):
            new = make_node(g, target, args, like=user)
        user.replace_all_uses_with(new)
        g.erase_node(user)


def _batch(conv: fx.Node) -> int | None:
    """A convolution's static batch (its input's dim 0), None when dynamic."""
    v = conv.args[0].meta.get("val") if isinstance(conv.args[0], fx.Node) else None
    return v.shape[0] if v is not None and v.dim() and isinstance(v.shape[0], int) else None


def _linear_args(user: fx.Node):
    """``(x, bias, activation)`` of a linear user, ``activation`` as the quantized op's trailing
    arguments: ``()`` for a plain linear, ``(name,)`` for a ``circle.linear_act``."""
    x, _, bias, *rest = arguments(user)
    return x, bias, tuple(rest) if user.target is linear_act and rest != ["none"] else ()


def _conv_uses(attr: fx.Node) -> bool:
    """``attr`` is read only as the weight of convolutions (``circle.conv2d_nhwc``)."""
    return bool(attr.users) and all(u.target is conv2d_nhwc and len(u.args) > 1 and u.args[1] is attr
                                    and attr not in u.args[:1] + u.args[2:] for u in attr.users)


def _layer_index(name: str) -> int | None:
    """The decoder layer of a weight: the first number after a dotted name in its (first member's)
    name, ``model.layers.3.mlp.up_proj.weight`` -> 3, ``transformer.h.3.attn...`` -> 3; None when it
    has none (embedding, lm_head) or starts with one (a top-level ``Sequential``'s ``0.weight``)."""
    m = re.search(r"[^.]\.(\d+)\.", name.split("+")[0] + ".")
    return int(m.group(1)) if m else None


def _rows(node) -> int | None:
    """A linear's row count (product of its input's leading dims), None when a dim is dynamic."""
    v = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if v is None or any(not isinstance(d, int) for d in v.shape):
        return None
    return int(np.prod(v.shape[:-1], dtype=np.int64))


def _dynamic(node) -> bool:
    """True when a linear's input has a symbolic (dynamic) dim."""
    v = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return v is not None and any(not isinstance(d, int) for d in v.shape)


def display_name(name: str) -> str:
    """``model.layers.0.mlp.down_proj.weight`` -> ``model.layers.0.mlp.down_proj``; members of a
    merged weight (``a.weight+b.weight``) likewise, joined by ``+``."""
    return "+".join(p[:-len(".weight")] if p.endswith(".weight") else p for p in name.split("+"))


def compact_names(names) -> str:
    """Weight names with the layer index folded: ``model.layers.{0-29}.mlp.down_proj`` instead of
    30 names (a name whose dotted numbers differ, or has none, is listed as is)."""
    groups: dict[str, list[int]] = {}
    for name in map(display_name, names):
        nums = set(re.findall(r"\.(\d+)\.", name))
        if len(nums) != 1:
            groups.setdefault(name, [])
            continue
        n = nums.pop()
        groups.setdefault(name.replace(f".{n}.", ".{}."), []).append(int(n))
    out = []
    for key, idx in groups.items():
        if not idx:
            out.append(key)
            continue
        runs, start = [], idx[0]
        for a, b in zip(idx, idx[1:] + [None]):
            if b != a + 1:
                runs.append(str(start) if start == a else f"{start}-{a}")
                start = b
        out.append(key.replace("{}", runs[0] if len(idx) == 1 else "{" + ",".join(runs) + "}"))
    return ", ".join(out) or "(none)"


def _matches(pattern: str, name: str) -> bool:
    """A merged weight (``a.weight+b.weight``, from ``merge_linears``) matches when any part does:
    it is one tensor, so skipping one member keeps the whole merged weight float."""
    for part in name.split("+"):
        module = part.rsplit(".", 1)[0] if "." in part else part
        if fnmatch.fnmatchcase(part, pattern) or fnmatch.fnmatchcase(module, pattern):
            return True
    return False
