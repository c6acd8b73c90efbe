"""Convolutions and pools in their torch forms, each exported, run in onert and compared with eager.

Each form exercises one decision of ``layout/decompositions.py`` / ``emit/lowerings/conv.py``:
SAME vs PAD + VALID, asymmetric padding (``padding="same"`` with an even kernel, ``ceil_mode``),
depthwise with and without a channel multiplier, other group counts (SPLIT + CONCATENATION),
dilation (a dilated max pool as strided taps), 1-D convolutions, transposed ones and max pools
as 2-D ones, circular padding, and the average-pool divisor correction.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import circle_fx
from circle_fx.errors import CircleFxError

from onert_eager import Fn, assert_onert_matches_eager


def r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


X3 = r(1, 3, 9, 12)   # odd height, even width: SAME's split of odd padding shows
X4 = r(2, 4, 9, 12, seed=1)

#: name -> (module, input, Circle op that must appear)
FORMS = {
    "conv_same_padding": (nn.Conv2d(3, 8, 3, padding=1), X3, "CONV_2D"),
    "conv_stride2_pad1": (nn.Conv2d(3, 8, 3, stride=2, padding=1), X3, "CONV_2D"),
    "conv_valid_dilated_no_bias": (nn.Conv2d(3, 4, 3, dilation=2, bias=False), X3, "CONV_2D"),
    "conv_padding_same_even_kernel": (nn.Conv2d(3, 4, 4, padding="same"), X3, "CONV_2D"),
    "conv_rect_kernel_asym_pad": (nn.Conv2d(3, 5, (1, 3), stride=(2, 1), padding=(2, 0)), X3, "CONV_2D"),
    "conv_7x7_stride2_pad3": (nn.Conv2d(3, 4, 7, stride=2, padding=3), X3, "CONV_2D"),
    "depthwise": (nn.Conv2d(4, 4, 3, padding=1, groups=4), X4, "DEPTHWISE_CONV_2D"),
    "depthwise_multiplier_stride2": (nn.Conv2d(4, 8, 3, stride=2, groups=4), X4, "DEPTHWISE_CONV_2D"),
    "depthwise_dilated": (nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4), X4, "DEPTHWISE_CONV_2D"),
    "grouped": (nn.Conv2d(4, 6, 3, groups=2, padding=(0, 1)), X4, "SPLIT"),
    "max_pool_pad": (nn.MaxPool2d(3, 2, 1), X4, "MAX_POOL_2D"),
    "max_pool_ceil": (nn.MaxPool2d(2, 2, ceil_mode=True), X4, "MAX_POOL_2D"),
    "avg_pool": (nn.AvgPool2d(2), X4, "AVERAGE_POOL_2D"),
    "avg_pool_pad_counted": (nn.AvgPool2d(3, 2, 1), X4, "AVERAGE_POOL_2D"),
    "avg_pool_pad_excluded": (nn.AvgPool2d(3, 1, 1, count_include_pad=False), X4, "AVERAGE_POOL_2D"),
    "avg_pool_ceil": (nn.AvgPool2d(3, 2, ceil_mode=True), X4, "AVERAGE_POOL_2D"),
    "avg_pool_divisor_override": (nn.AvgPool2d(2, divisor_override=3), X4, "AVERAGE_POOL_2D"),
    # EfficientNet's pooler: a window far longer than the map (ceil_mode: one output)
    "avg_pool_kernel_beyond_input": (nn.AvgPool2d(2560, ceil_mode=True), r(1, 4, 2, 3), "AVERAGE_POOL_2D"),
    "avg_pool_kernel_beyond_padded_input": (nn.AvgPool2d(7, 7, 1, ceil_mode=True), r(1, 4, 2, 3), "AVERAGE_POOL_2D"),
    "avg_pool_kernel_beyond_padding_excluded": (nn.AvgPool2d(7, 7, 1, ceil_mode=True, count_include_pad=False),
                                                r(1, 4, 2, 3), "AVERAGE_POOL_2D"),
    "max_pool_kernel_beyond_input": (nn.MaxPool2d(7, ceil_mode=True), r(1, 4, 2, 3), "MAX_POOL_2D"),
    "adaptive_avg_pool_global": (nn.AdaptiveAvgPool2d(1), X4, "AVERAGE_POOL_2D"),
    "adaptive_avg_pool_3x4": (nn.AdaptiveAvgPool2d((3, 4)), X4, "AVERAGE_POOL_2D"),
    # uneven bins: 9 -> 2 is [0, 5), [4, 9) (kernel 5, stride 4), 12 -> 5 has bins of 3 and 4
    "adaptive_avg_pool_uneven_2x5": (nn.AdaptiveAvgPool2d((2, 5)), X4, "CONCATENATION"),
    "adaptive_avg_pool_upernet_6": (nn.AdaptiveAvgPool2d(6), r(1, 4, 16, 16), "CONCATENATION"),
    "adaptive_avg_pool_uniform_7_to_3": (nn.AdaptiveAvgPool2d(3), r(1, 4, 7, 7), "AVERAGE_POOL_2D"),
    # one input cell copied to every bin (VGG's AdaptiveAvgPool2d(7) on a 1 x 1 map): no stride-0 pool
    "adaptive_avg_pool_1_to_7": (nn.AdaptiveAvgPool2d(7), r(1, 4, 1, 1), "CONCATENATION"),
    "adaptive_avg_pool1d_swin": (nn.AdaptiveAvgPool1d(1), r(2, 6, 10), "MEAN"),
    "adaptive_avg_pool1d_uneven": (nn.AdaptiveAvgPool1d(4), r(2, 6, 10), "CONCATENATION"),
    "adaptive_avg_pool1d_unbatched": (nn.AdaptiveAvgPool1d(5), r(6, 10), "AVERAGE_POOL_2D"),
    "conv1d_grouped": (nn.Conv1d(4, 6, 3, padding=1, groups=2), r(2, 4, 10), "CONV_2D"),
    "conv1d_depthwise_causal_pad": (nn.Conv1d(4, 4, 4, padding=3, groups=4), r(1, 4, 10), "DEPTHWISE_CONV_2D"),
    "conv1d_stride2": (nn.Conv1d(4, 3, 5, stride=2, padding=2), r(1, 4, 11), "CONV_2D"),
    # transposed convolutions: zeros between rows/columns + a stride-1 convolution
    "conv_transpose_stride1": (nn.ConvTranspose2d(4, 3, 3), X4, "CONV_2D"),
    "conv_transpose_s2_pad_outpad": (nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), X4,
                                     "CONV_2D"),
    "conv_transpose_rect_no_bias": (nn.ConvTranspose2d(4, 3, (2, 3), stride=(2, 1), padding=(0, 1), bias=False), X4,
                                    "CONV_2D"),
    "conv_transpose_pad_beyond_kernel": (nn.ConvTranspose2d(4, 3, 3, stride=3, padding=3, output_padding=2), X4,
                                         "CONV_2D"),
    "conv_transpose_grouped_dilated": (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2, padding=1), X4,
                                       "SPLIT"),
    "conv_transpose_depthwise": (nn.ConvTranspose2d(4, 4, 3, stride=2, groups=4), X4, "DEPTHWISE_CONV_2D"),
    # 1-D transposed (a vocoder's upsampling): a unit height, the 2-D form
    "conv_transpose1d_s2_outpad": (nn.ConvTranspose1d(4, 3, 4, stride=2, padding=1, output_padding=1), r(2, 4, 10),
                                   "CONV_2D"),
    "conv_transpose1d_grouped": (nn.ConvTranspose1d(4, 6, 3, stride=3, groups=2), r(1, 4, 7), "SPLIT"),
    # dilated max pools: MAX_POOL_2D has no dilation, so the maximum of the window's strided taps
    "max_pool_dilated": (nn.MaxPool2d(3, 1, 1, dilation=2), X4, "MAXIMUM"),
    "max_pool_dilated_rect_ceil": (nn.MaxPool2d((3, 2), (2, 1), (1, 0), dilation=(2, 3), ceil_mode=True), X4,
                                   "MAXIMUM"),
    "max_pool1d": (nn.MaxPool1d(3, 2, 1), r(2, 4, 11), "MAX_POOL_2D"),
    "max_pool1d_dilated_ceil": (nn.MaxPool1d(3, 2, 1, dilation=2, ceil_mode=True), r(2, 4, 11), "MAXIMUM"),
    "max_pool1d_unbatched": (nn.MaxPool1d(2), r(4, 10), "MAX_POOL_2D"),
    # adaptive max pools: one max pool for uniform bins, else a maximum per bin; the indices (flat
    # positions in the input plane, as torch's) from each bin's ARG_MAX
    "adaptive_max_pool_uniform": (nn.AdaptiveMaxPool2d((3, 4)), X4, "MAX_POOL_2D"),
    "adaptive_max_pool_uneven_indices": (nn.AdaptiveMaxPool2d((2, 5), return_indices=True), X4, "ARG_MAX"),
    "adaptive_max_pool_1_to_3_indices": (nn.AdaptiveMaxPool2d(3, return_indices=True), r(1, 2, 1, 2), "ARG_MAX"),
    # 3-D: a sum of 2-D convolutions over the time taps (Qwen-VL's temporal patch embedding, video)
    "conv3d_patch_embedding": (nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4), bias=False), r(3, 3, 2, 8, 8), "CONV_2D"),
    "conv3d_padded": (nn.Conv3d(4, 6, 3, padding=1), r(1, 4, 4, 6, 5), "CONV_2D"),
    "conv3d_strided_dilated_grouped": (nn.Conv3d(4, 6, (3, 3, 1), stride=(2, 1, 2), padding=(2, 1, 0), dilation=(2, 1, 1),
                                                 groups=2), r(2, 4, 7, 6, 5), "SPLIT"),
    # periodic boundaries: the wrapped-around slices concatenated
    "circular_pad_conv": (nn.Conv2d(4, 3, 3, padding=(1, 2), padding_mode="circular"), X4, "CONCATENATION"),
    # norms and resampling: exact decompositions into ops onert runs
    "group_norm": (nn.GroupNorm(2, 4), X4, "MEAN"),
    "group_norm_per_channel_no_affine": (nn.GroupNorm(4, 4, affine=False), r(2, 4, 10), "MEAN"),
    "batch_norm_eval": (nn.BatchNorm2d(4), X4, "MUL"),
    "upsample_nearest": (nn.Upsample(scale_factor=2, mode="nearest"), X4, "GATHER"),
    "upsample_bilinear": (nn.Upsample(scale_factor=2, mode="bilinear"), X4, "GATHER"),
    "upsample_bilinear_align_corners": (nn.Upsample(size=(5, 7), mode="bilinear", align_corners=True), X4, "GATHER"),
    "pixel_shuffle": (nn.PixelShuffle(2), X4, "TRANSPOSE"),
}


@pytest.mark.parametrize("name", list(FORMS))
def test_form_runs_in_onert(name):
    module, x, op = FORMS[name]
    torch.manual_seed(0)
    cm = assert_onert_matches_eager(module, (x,), rtol=1e-4, atol=1e-5)
    assert op in cm.op_histogram(), cm.op_histogram()


def test_same_padding_needs_no_pad_op():
    """Symmetric padding equal to Circle's SAME (stride 1, odd kernel) is SAME: no PAD."""
    cm = circle_fx.export(nn.Conv2d(3, 8, 3, padding=1).eval(), (X3,))
    assert "PAD" not in cm.op_histogram() and cm.op_histogram()["CONV_2D"] == 1


def test_unsupported_forms_name_the_op():
    with pytest.raises(CircleFxError, match="avg_pool3d"):  # Circle has no 3-D pool
        circle_fx.export(nn.AvgPool3d(2).eval(), (X4.unsqueeze(2).expand(-1, -1, 4, -1, -1),))
    with pytest.raises(CircleFxError, match="must be a constant"):
        circle_fx.export(Fn(lambda x, w: torch.nn.functional.conv2d(x, w)), (X3, r(2, 3, 3, 3)))


@pytest.mark.parametrize("module, x", [
    # Kimi-Linear's short convolution shape: causal depthwise conv1d over thousands of channels
    (nn.Conv1d(4848, 4848, 4, padding=3, groups=4848, bias=False), r(1, 4848, 6)),
    # a channel multiplier: 2500 input channels, 5000 deep, split on whole input channels
    (nn.Conv2d(2500, 5000, 3, padding=1, groups=2500), r(1, 2500, 3, 3)),
], ids=["conv1d_4848", "multiplier2_5000"])
def test_depthwise_deeper_than_onert_runs_is_split_by_channels(module, x):
    """onert 0.1.0's DEPTHWISE_CONV_2D never returns beyond depth ``limits.DEPTHWISE_DEPTH``:
    the ranks legalization step runs it as channel slices (export's verify would refuse an
    unsplit one before onert could hang on it)."""
    from circle_fx.circle import limits, op_table
    cm = assert_onert_matches_eager(module, (x,), rtol=1e-4, atol=1e-5)
    assert cm.op_histogram()["DEPTHWISE_CONV_2D"] == 2, cm.op_histogram()
    assert op_table.rank_problem("DEPTHWISE_CONV_2D", [], [1, 1, 6, limits.DEPTHWISE_DEPTH]) is None
    assert "hangs" in op_table.rank_problem("DEPTHWISE_CONV_2D", [], [1, 1, 6, limits.DEPTHWISE_DEPTH + 1])
