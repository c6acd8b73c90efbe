"""Per-architecture onert limits (circle/limits.py ARCH_ONLY): measured on x86_64 and aarch64
(benchmarks/arm64_limits.py); verify reports an operator wrong on one of them as a warning."""
import numpy as np
import pytest

from circle_fx.circle import limits
from circle_fx.circle.schema import BO, TT, make_options
from circle_fx.circle.verify import verify
from circle_fx.emit.builder import ModelBuilder
from circle_fx.emit.writer import serialize


def _split_v_file() -> bytes:
    mb = ModelBuilder()
    x = mb.add_tensor("x", [1, 10], TT.FLOAT32)
    sizes = mb.add_constant("sizes", np.array([3, 7], np.int32))
    axis = mb.add_constant("axis", np.array(1, np.int32))
    a, b = mb.add_tensor("a", [1, 3], TT.FLOAT32), mb.add_tensor("b", [1, 7], TT.FLOAT32)
    mb.add_operator(BO.SPLIT_V, [x, sizes, axis], [a, b], make_options("SplitVOptions", numSplits=2))
    mb.inputs, mb.outputs, mb.input_names, mb.output_names = [x], [a, b], ["x"], ["a", "b"]
    return serialize(mb).to_bytes()


def test_verify_reports_an_operator_wrong_on_one_architecture():
    with pytest.warns(UserWarning, match="SPLIT_V: onert 0.1.0 on x86_64 returns all zeros"):
        report = verify(_split_v_file())
    assert report.arch_limits == ["SPLIT_V: onert 0.1.0 on x86_64 returns all zeros (aarch64: exact)"]
    assert "x86_64" in str(report)


def test_operators_right_on_both_architectures_are_not_reported():
    assert limits.arch_problems(["FULLY_CONNECTED", "ROPE", "SPLIT"]) == []
