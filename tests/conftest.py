"""Shared pytest setup for circle_fx tests."""
# Every model the tests export is verified by export itself (``export(..., verify=True)`` is the
# default), so structural bugs in any lowering fail the test that produced them instead of
# surfacing as an onert crash; no hook is needed here.
import circle_fx as _cfx


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
