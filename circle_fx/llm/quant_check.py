"""``export-llm --check`` for a quantized package: agreement with the float model, judged
against what an honest quantization costs on the same model.

A quantized package cannot give the float model's tokens exactly, so ``--check`` with
``--quantize`` measures instead, on the check prompt followed by the float model's ``N`` greedy
tokens (teacher-forced: every position is fed the float model's token, so one early divergence
does not cascade into a meaningless tail):

- the **first diverging greedy token** (the first new token where the package's top-1 differs from
  the float model's; up to there teacher forcing and free-running greedy are the same run);
- **top-1 agreement** of the package's logits with float eager at every position (the decode steps
  from position 0, plus the prefill model's last logits);
- the **mean KL(float || package)** in nats over those positions.

A bare KL bound would not carry from one model to another (a small model loses more per bit than
a large one), so the KL is judged against a **yardstick** computed in eager on the same positions:
the float model with each weight the package quantized replaced by the plain rounding of its
encoding (ggml's reference ``m / -8`` Q4_0, Q8_0, int8 per row) and each quantized linear's input
rounded as onert's kernel does (per row to int8 for the hybrid int8 FULLY_CONNECTED, per block of
32 to Q8_0 for ggml's). That is what an honest quantization costs on this model; circle_fx's Q4_0
scale search and importance weighting should do better. The check **fails when the package's mean
KL is more than** ``KL_RATIO`` **(2.5) times the yardstick's, or more than** ``KL_FLOOR`` **(0.001
nats) when the yardstick is smaller** (an int8 tiny model). Measured on SmolLM2-135M-Instruct
(``--max-seq-len 64 --check 16``: 32 prompt tokens + 16, 48 positions; x86 onert, 2026-12-07):
int8-weights 0.055 nats = 1.03x the yardstick, q4_0-mix 0.21 nats = 1.31x, the q4_0 preset (lm_head
Q8_0, data-free calibration; its tied table rounded as each use reads it) 0.27 nats = 0.56x; one
down_proj (layer 10 of 30) written with its scale x4: int8 2.1 nats = 40x, q4_0 2.06 nats = 4.2x;
x2: int8 0.32 nats = 5.9x fails, but q4_0 0.48 nats = 0.98x passes. It catches a broken package,
not a quantization that is merely worse than it could be (that is benchmarks/quant_accuracy.py's job).

GGML weights (q8_0 / q4_0, and int8 linears stored as Q8_0 blocks for the prefill) do not run in
x86 onert without AVX-512 (:mod:`circle_fx.circle.ggml_support`): the package then runs on
onert's aarch64 build under qemu (:mod:`circle_fx.circle.arm64`) when it is set up, else the
check stops with an error saying why (:func:`package_runtime`).
"""
from __future__ import annotations

import contextlib
import math
import platform
from dataclasses import dataclass, field

import numpy as np

from ..errors import CircleFxError

#: the check fails when the package's mean KL exceeds KL_RATIO x the yardstick's ...
KL_RATIO = 2.5
#: ... or KL_FLOOR nats, whichever is larger (a yardstick near 0 would otherwise fail on noise)
KL_FLOOR = 1e-3
THRESHOLD_TEXT = (f"mean KL(float || package) <= max({KL_RATIO:g} x the yardstick, {KL_FLOOR:g} nats); "
                  "yardstick: the float model with plain rounding of the same weights (ggml's reference "
                  "Q4_0 / Q8_0, int8 rows) and of the linears' inputs, in eager")

_LINEAR_MODES = ("int8", "q8_0", "q4_0")


@dataclass
class Agreement:
    """What :func:`compare` measured; :attr:`passed` applies the threshold."""

    prompt: list
    float_tokens: list  #: the float model's greedy new tokens
    positions: int  #: logits compared (decode steps + the prefill's last position)
    top1: int  #: positions where the package's top-1 is the float model's
    kl: float  #: mean KL(float || package), nats
    yardstick: float  #: mean KL(float || plain rounding in eager), nats, on the same positions
    yardstick_top1: int
    first_divergence: int | None  #: index of the first new token the package would pick differently
    package_pick: int | None  #: its pick there
    where: str  #: which onert ran the package
    notes: list = field(default_factory=list)

    @property
    def threshold(self) -> float:
        return max(KL_RATIO * self.yardstick, KL_FLOOR)

    @property
    def passed(self) -> bool:
        return math.isfinite(self.kl) and self.kl <= self.threshold

    def lines(self) -> list[str]:
        n = len(self.float_tokens)
        if self.first_divergence is None:
            div = f"none: the package picks the float model's {n} greedy tokens"
        else:
            k = self.first_divergence
            div = (f"new token {k + 1} of {n} (float picks {self.float_tokens[k]}, the package {self.package_pick}"
                   + (f"; the first {k} agree)" if k else ")"))
        ratio = self.kl / self.yardstick if self.yardstick > 0 else float("inf")
        return [f"--check (quantized, {self.where}): prompt {self.prompt} + {n} greedy tokens of the float model, "
                "teacher-forced",
                f"  first diverging greedy token: {div}",
                f"  top-1 agreement with float: {self.top1}/{self.positions} positions "
                f"(yardstick {self.yardstick_top1}/{self.positions})",
                f"  mean KL(float || package) {self.kl:.4g} nats = {ratio:.2f} x the yardstick's {self.yardstick:.4g} "
                f"nats; threshold {self.threshold:.4g} nats ({THRESHOLD_TEXT})",
                *(f"  note: {x}" for x in self.notes)]


def package_runtime(path: str):
    """``(runtime or None, where)`` to run the package file ``path`` in: None is this host's onert;
    a file with GGML weights this host's onert cannot run goes to onert's aarch64 build under qemu
    (:class:`~circle_fx.circle.arm64.Arm64Runtime`), or raises :class:`CircleFxError` saying why
    the check cannot run here (never onert's SIGILL)."""
    from ..circle import ggml_support

    here = f"{platform.machine()} onert"
    if not ggml_support.has_block_tensors(path):
        return None, here
    why = ggml_support.ggml_unsupported_reason()
    if not why:
        return None, here
    from ..circle import arm64

    missing = arm64.Arm64Env().missing()
    if missing:
        raise CircleFxError(
            f"--check cannot run this package here: it has GGML block weights (q8_0/q4_0, or int8 linears stored "
            f"as Q8_0 blocks for >= 16 rows), which this host's onert cannot run ({why}), and onert's aarch64 "
            f"build under qemu is not available ({missing}). Run `python scripts/arm64.py setup`, export without "
            "--check, or check an int8 export with --int8-rows (no GGML tensor); nothing was written")
    return arm64.Arm64Runtime(), f"onert aarch64 under qemu ({here} cannot run GGML here: {why})"


def compare(runner, model, prompt: list, new_tokens: int, encodings: dict, where: str = "onert") -> Agreement:
    """Measure the package in ``runner`` against ``model`` (float, eager) on ``prompt`` + ``new_tokens``
    greedy tokens; ``encodings``: the manifest's ``weights.decode`` (weight name -> encoding), which
    the yardstick rounds the same way. See the module docstring."""
    import torch

    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=None)[0].tolist()
        seq = want[:-1]  # position i's logits predict want[i + 1]
        ref = _logits(model, seq)
        with plain_rounding(model, encodings) as notes:
            yard = _logits(model, seq)
    got = []
    runner.reset()
    for p, t in enumerate(seq):
        got.append(np.asarray(runner.step(t, p), np.float64))
    rows = list(range(len(seq)))
    last = len(prompt) - 1
    if len(prompt) <= runner.prefill_len and (runner.prefill_pads or len(prompt) == runner.prefill_len):
        runner.reset()
        got.append(np.asarray(runner.run_prefill(prompt), np.float64))
        rows.append(last)  # the prefill model's last logits, against the same float row
    got = np.stack(got)
    kl, yard_kl = _kl(ref[rows], got), _kl(ref[rows], yard[rows])
    top = ref[rows].argmax(-1)
    picks = got[:len(seq)].argmax(-1)
    div = next((k for k in range(len(want) - len(prompt)) if picks[last + k] != want[len(prompt) + k]), None)
    return Agreement(prompt=list(prompt), float_tokens=want[len(prompt):], positions=len(rows),
                     top1=int((got.argmax(-1) == top).sum()), kl=float(kl.mean()), yardstick=float(yard_kl.mean()),
                     yardstick_top1=int((yard[rows].argmax(-1) == top).sum()), first_divergence=div,
                     package_pick=None if div is None else int(picks[last + div]), where=where, notes=notes)


def _logits(model, ids) -> np.ndarray:
    import torch

    return model(torch.tensor([ids]), use_cache=False).logits[0].double().numpy()


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, nats, from logits (float64)."""
    lp = p_logits - _logsumexp(p_logits)
    lq = q_logits - _logsumexp(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(-1, keepdims=True))


# ------------------------------------------------------------------ yardstick
def _encoding_of(names: list[str], encodings: dict, linear: bool) -> str | None:
    """The encoding the package stored a weight in for a linear / an embedding use (any of its tied
    names; a merged weight's key is its members joined by ``+``; a tied weight stored once per
    encoding reads ``LINEAR+TABLE``, e.g. ``q8_0+uint8``)."""
    table = {}
    for key, enc in encodings.items():
        for member in key.split("+"):
            table.setdefault(member, enc)
    for n in names:
        if n in table:
            parts = table[n].split("+")  # a tied weight split in two: the linear's encoding first
            return parts[0] if linear else parts[-1]
    return None


def _round_weight(w: np.ndarray, enc: str) -> np.ndarray:
    """``w`` [rows, cols] after the plain rounding of encoding ``enc`` (ggml's reference rules)."""
    import torch

    from ..circle import ggml
    from ..quant.ggml import pack

    if enc in ("int8", "uint8"):
        s = np.abs(w).max(-1, keepdims=True) / np.float32(127)
        s = np.where(s > 0, s, np.float32(1))
        return np.clip(np.rint(w / s), -127, 127) * s
    kind = ggml.BY_NAME[enc]
    blocks, _, _ = pack(torch.from_numpy(np.ascontiguousarray(w)), kind, search=False)
    return ggml.dequantize(kind, blocks.numpy(), w.shape)


def _round_input(enc: str):
    """A forward pre-hook rounding a linear's input as onert's kernel for ``enc`` does: the hybrid
    int8 FULLY_CONNECTED quantizes each row to int8, ggml's kernels each block of 32 to Q8_0."""
    import torch

    def hook(module, args):
        x = args[0]
        if enc == "int8":
            s = x.abs().amax(-1, keepdim=True) / 127
        else:
            s = x.unflatten(-1, (-1, 32)).abs().amax(-1, keepdim=True) / 127
        s = torch.where(s > 0, s, torch.ones_like(s))
        if enc == "int8":
            return (torch.round(x / s) * s,) + tuple(args[1:])
        xb = x.unflatten(-1, (-1, 32))
        return ((torch.round(xb / s) * s).flatten(-2),) + tuple(args[1:])

    return hook


def _swap_during(module, w, data) -> list:
    """Hooks making ``w`` hold ``data`` only while ``module`` runs (a tied table whose lookup reads
    another encoding than the lm_head: swapping the weight, not replacing the output, keeps what an
    Embedding subclass does around the lookup, e.g. Gemma's scale)."""
    held = {}

    def before(mod, args):
        held["w"] = w.data
        w.data = data

    def after(mod, args, out):
        w.data = held.pop("w")

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]


@contextlib.contextmanager
def plain_rounding(model, encodings: dict):
    """Within the block, ``model``'s linear and embedding weights that the package quantized hold
    their plain rounding (:func:`_round_weight`) and its quantized linears round their inputs
    (:func:`_round_input`); everything is restored on exit. Yields a list of notes (what could not
    be mirrored)."""
    import torch

    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n.removesuffix(".weight"))
    for n, m in model.named_modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            names.setdefault(id(m.weight), []).insert(0, n)
    saved, hooks, notes, done = [], [], [], {}
    try:
        modules = [m for _, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
        modules.sort(key=lambda m: not isinstance(m, torch.nn.Linear))  # a tied weight: the lm_head's encoding
        for m in modules:
            linear, w = isinstance(m, torch.nn.Linear), m.weight
            enc = _encoding_of(names.get(id(w), []), encodings, linear)
            if enc is None:
                continue
            if enc not in ("int8", "uint8", "q8_0", "q4_0") or (enc in ("q8_0", "q4_0") and w.shape[1] % 32):
                notes.append(f"yardstick: {names[id(w)][0]} ({enc}, {w.shape[1]} columns) kept float")
                continue
            if linear and enc in _LINEAR_MODES:
                hooks.append(m.register_forward_pre_hook(_round_input(enc)))
            if id(w) in done:  # a tied weight: rounded as its linear (the lm_head) reads it ...
                if done[id(w)] != enc:  # ... and as the package's table holds it while the lookup runs
                    orig = next(data for ww, data in saved if ww is w)
                    table = torch.from_numpy(_round_weight(orig.float().numpy(), enc)).to(w.dtype)
                    hooks += _swap_during(m, w, table)
                    notes.append(f"yardstick: tied {names[id(w)][0]}: the lm_head rounded as {done[id(w)]}, "
                                 f"the table as {enc} (the package stores both)")
                continue
            done[id(w)] = enc
            saved.append((w, w.data))
            w.data = torch.from_numpy(_round_weight(w.data.float().numpy(), enc)).to(w.dtype)
        yield notes
    finally:
        for h in hooks:
            h.remove()
        for w, data in saved:
            w.data = data
