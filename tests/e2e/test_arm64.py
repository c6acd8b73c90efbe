"""circle_fx's files on onert's aarch64 build (qemu-user, ``circle_fx.circle.arm64``) against x86 onert and
eager: a few families, every weight mode, PT2E uint8, a CNN (conv / pool / NHWC, float and int8-weights)
and one LLM package generating a handful of tokens. The full corpus is scripts/arm64_support.py
(docs/arm64-support.md).

The arm64 side is built once per machine by ``make arm64`` (``make install`` runs it; ~40 s, plus
apt-get of qemu-user-static and debootstrap on a fresh machine) and cached under
~/.cache/circle_fx/arm64; the slow tests skip, saying why, where it is absent (no qemu, not root).
Measured on the dev VM at load average ~17: the 13 slow tests take 82 s (pytest; 98 s wall with collection) on a warm cache.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.arm64 import Arm64Env, Arm64Runtime, Arm64Unavailable

WHY = Arm64Env().missing()
needs_arm64 = pytest.mark.skipif(WHY is not None, reason=f"arm64 onert unavailable: {WHY}")


@pytest.fixture(scope="module")
def arm():
    with Arm64Runtime() as rt:
        yield rt


#: largest max |arm64 - x86| / max |eager| per weight mode: the quantized kernels are other code on
#: aarch64 (docs/arm64-support.md: float, int8-weights and q8_0 agree to rounding, q4_0 within ~1 %)
ARM_X86 = {None: 1e-5, "int8-weights": 1e-5, "q8_0": 1e-5, "q4_0": 2e-2, "q4_0-mix": 2e-2, "pt2e": 1e-5}


#: largest max |arm64 - eager| / max |eager| of a GGML file where x86 onert cannot run it (no AVX-512:
#: ggml_support), ~2x what both architectures measured (tiny Llama: q8_0 ~0.01, q4_0 ~0.2)
GGML_EAGER = {"int8-weights": 0.05, "q8_0": 0.05, "q4_0": 0.4, "q4_0-mix": 0.4}


def _x86_cannot_run(cm) -> str | None:
    from circle_fx.circle.ggml_support import ggml_unsupported_reason
    from circle_fx.circle.reader import read_circle

    if not any("GGML" in t.type_name for t in read_circle(cm.to_bytes()).tensors):
        return None
    return ggml_unsupported_reason()


def _check(cm, inputs, eager, mode, arm):
    a = cm.run(*inputs, runtime=arm)[0]
    scale = float(np.abs(eager).max())
    if _x86_cannot_run(cm):  # GGML on a host without AVX-512: arm64 against eager alone
        d = float(np.abs(a - eager).max()) / scale
        assert d <= GGML_EAGER[mode], f"{mode}: max |arm64 - eager| / scale = {d:.3g} (x86 cannot run GGML here)"
        return a, None
    x86 = cm.run(*inputs)[0]
    d = float(np.abs(a - x86).max()) / scale
    assert d <= ARM_X86[mode], f"{mode}: max |arm64 - x86| / scale = {d:.3g}"
    # arm64 is no further from eager than x86 is, beyond rounding
    arm_err, x86_err = float(np.abs(a - eager).max()), float(np.abs(x86 - eager).max())
    assert arm_err <= 1.1 * x86_err + 1e-4 * scale, f"{mode}: arm64 {arm_err:.3g} vs x86 {x86_err:.3g} from eager"
    if mode is None:
        np.testing.assert_allclose(a, eager, rtol=1e-4, atol=1e-4)
    return a, x86


@needs_arm64
@pytest.mark.slow
@pytest.mark.parametrize("family,mode", [("llama", None), ("llama", "int8-weights"), ("llama", "q8_0"),
                                         ("llama", "q4_0"), ("llama", "q4_0-mix"), ("gemma3", None),
                                         ("qwen3", "q8_0")])
def test_decoder_on_arm64(family, mode, arm):
    import llm_models

    model = llm_models.tiny(family)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False}, quantize=mode)
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits.numpy()
    _check(cm, [ids], eager, mode, arm)


class _Cnn(torch.nn.Module):
    """conv + BN + ReLU, depthwise conv, max and average pools, linear head: the NHWC forms."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        x = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.dw(x)), 1)
        return self.fc(x.flatten(1))


@needs_arm64
@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "int8-weights", "pt2e"])
def test_cnn_on_arm64(mode, arm):
    torch.manual_seed(0)
    model = _Cnn().eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        eager = model(x).numpy()
    if mode == "pt2e":
        from circle_fx.quant.static_flow import quantize_static

        q, _ = quantize_static(model, (x,), calibration=[(torch.randn(1, 3, 16, 16),) for _ in range(4)] + [(x,)])
        cm = circle_fx.export(q, (x,), quant_target="onert", verbose=False)
    else:
        cm = circle_fx.export(model, (x,), quantize=mode, verbose=False)
    _check(cm, [x], eager, mode, arm)


@needs_arm64
@pytest.mark.slow
def test_package_generates_on_arm64(arm, tmp_path):
    """The LLM runner's own logic on arm64 sessions: prefill + decode steps, the tokens of
    transformers' greedy generation (float), the logits of x86 onert."""
    import llm_models

    hf_greedy = llm_models.greedy_reference().hf_greedy
    model = llm_models.tiny("llama")
    model.config.use_cache = model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=12, prefill_len=4, tokenizer=None)
    pkg.save(tmp_path)
    prompt, new = [5, 17, 9], 4
    want, scores = hf_greedy(model, prompt, new)
    x86 = pkg.runner().generate(prompt, new, eos_token_ids=[], return_logits=True, use_prefill=True)
    runner = pkg.runner(runtime=arm)
    for use_prefill in (True, False):
        got, logits = runner.generate(prompt, new, eos_token_ids=[], return_logits=True, use_prefill=use_prefill)
        assert got == want
        assert max(float(np.abs(g - s).max()) for g, s in zip(logits, scores)) < 1e-4
        assert max(float(np.abs(g - s).max()) for g, s in zip(logits, x86[1])) < 1e-5


def test_missing_arm64_side_is_a_clear_error(tmp_path):
    """No built root (or no qemu): a named reason, never a traceback from qemu or pickle."""
    env = Arm64Env(cache=str(tmp_path))
    why = env.missing()
    assert why is not None and ("qemu" in why or "scripts/arm64.py setup" in why)
    with pytest.raises(Arm64Unavailable, match="qemu|not built"):
        Arm64Runtime(env)


@needs_arm64
@pytest.mark.slow
def test_worker_reports_onert_errors(arm, tmp_path):
    """A file onert refuses is a RuntimeFailure naming it, and the worker keeps serving."""
    from circle_fx.errors import RuntimeFailure

    bad = tmp_path / "bad.circle"
    bad.write_bytes(b"\0" * 64)
    with pytest.raises(RuntimeFailure, match="bad.circle"):
        arm.session(str(bad), verified=True)
    assert arm.info()["machine"] == "aarch64"


@needs_arm64
@pytest.mark.slow
def test_a_session_outlives_its_worker(tmp_path):
    """Closing the runtime (or a worker crash) ends the worker; its sessions reopen in the next one."""
    model = torch.nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    cm = circle_fx.export(model, (x,))
    rt = Arm64Runtime()
    first = cm.run(x, runtime=rt)[0]
    rt.close()
    np.testing.assert_array_equal(cm.run(x, runtime=rt)[0], first)
    rt.close()
