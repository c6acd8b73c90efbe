"""Shared pytest setup for circle_fx tests."""
# --- verify every emitted model ----------------------------------------------
# Every CircleModel the tests export (api.lower, inline weights), run (.run) or save
# (.save) is checked with circle_fx.verify, so structural bugs in any lowering fail the
# test that produced them instead of surfacing as an onert crash. The library's own
# api.lower() does not verify (speed). Set CIRCLE_FX_VERIFY=0 to switch this off.
import os as _os

import circle_fx as _cfx
from circle_fx.model import CircleModel as _CircleModel


def _verified_run(run):
    def wrapper(self, *inputs):
        if not getattr(self, "_cfx_verified", False):
            _cfx.verify(self)
            self._cfx_verified = True
        return run(self, *inputs)
    wrapper.__wrapped__ = run
    return wrapper


def _verified_save(save):
    def wrapper(self, path, *args, **kwargs):
        out = save(self, path, *args, **kwargs)
        _cfx.verify(_os.fspath(out))
        return out
    wrapper.__wrapped__ = save
    return wrapper


def _verified_lower(lower):
    def wrapper(*args, **kwargs):
        cm = lower(*args, **kwargs)
        if not cm.serialized.external:  # external (> 2 GB) files are verified when saved
            _cfx.verify(cm)
            cm._cfx_verified = True
        return cm
    wrapper.__wrapped__ = lower
    return wrapper


if _os.environ.get("CIRCLE_FX_VERIFY", "1") != "0":
    import circle_fx.api as _api

    _CircleModel.run = _verified_run(_CircleModel.run)
    _CircleModel.save = _verified_save(_CircleModel.save)
    _api.lower = _verified_lower(_api.lower)  # export() calls it by module-global name
# ----------------------------------------------------------------------------------------


# --- shared models -----------------------------------------------------------------------
import pytest as _pytest


@_pytest.fixture(scope="session")
def tiny_llama():
    """``(model, (input_ids,))``: the 2-layer random-weight Llama of ``make demo``."""
    from circle_fx.demo import tiny_llama as build

    return build()


@_pytest.fixture(scope="session")
def tiny_llama_circle(tiny_llama):
    """The tiny Llama exported with the default pipeline (shared: treat as read-only)."""
    model, inputs = tiny_llama
    return _cfx.export(model, inputs)


@_pytest.fixture(autouse=True)
def _seed_torch():
    """Each test starts from the same global torch RNG state: a plain ``torch.randn`` in a
    test gives the same values whether the test runs alone, in any order, or in another
    process, so a tolerance check cannot pass or fail depending on what ran before it."""
    import torch

    torch.manual_seed(0)
