"""Shared pytest setup for circle_fx tests."""
# --- verify every emitted model (issue 5) ----------------------------------------------
# Every CircleModel a test runs (.run) or saves (.save) is first checked with
# circle_fx.verify, so structural bugs in any lowering fail the test that produced them
# instead of surfacing as an onert crash. api.lower() itself does not verify (speed).
# Set CIRCLE_FX_VERIFY=0 to switch this off.
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


if _os.environ.get("CIRCLE_FX_VERIFY", "1") != "0":
    _CircleModel.run = _verified_run(_CircleModel.run)
    _CircleModel.save = _verified_save(_CircleModel.save)
# ----------------------------------------------------------------------------------------
