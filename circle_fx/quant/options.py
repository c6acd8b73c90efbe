"""The ``--quantize`` options both command lines share (``circle-fx export`` and ``export-llm``).

One place so the two commands cannot drift: ``--quantize PRESET`` picks a preset
(:data:`~circle_fx.quant.config.PRESETS`), and ``--override PATTERN=MODE`` (repeatable),
``--embedding MODE``, ``--lm-head MODE`` and ``--int8-rows`` refine it into a
:class:`~circle_fx.quant.config.QuantConfig` (:func:`~circle_fx.quant.config.from_options`).
A pattern that matches no linear is the export's own error, which names it; the overrides'
matches are printed after the export (:func:`override_report`).
"""
from __future__ import annotations

from .config import EMBEDDING_MODES, FLOAT, LM_HEAD_AUTO, PRESETS, WEIGHT_MODES, from_options


def add_arguments(parser, what: str = "") -> None:
    parser.add_argument("--quantize", choices=list(PRESETS), default=None,
                        help=(what or "") + "int8-weights: linear weights int8, embedding tables uint8, one scale "
                        "per row (activations stay float32; about 1%% error per layer in onert). q8_0 / q4_0: "
                        "linear weights as GGML blocks of 32 (8.5 / 4.5 bits per weight; q4_0 also the "
                        "embedding table, lm_head at q8_0 (--lm-head q4_0 for 4 bits); its Q4_0 scales are weighted "
                        "by data-free calibration (the model run on seeded random ids) when it can be run in "
                        "memory: the output says on what; q4_0-mix also keeps the MLP output projections and the "
                        "first/last 2 layers at q8_0: more accurate, larger, slower)")
    parser.add_argument("--override", action="append", default=[], metavar="PATTERN=MODE",
                        help="with --quantize: the linears whose parameter or module name matches the glob "
                             f"PATTERN get MODE ({', '.join((*WEIGHT_MODES, FLOAT))}); repeatable, the first "
                             "matching pattern wins; e.g. --override '*.mlp.down_proj=q8_0'. A pattern that "
                             "matches no linear is an error")
    parser.add_argument("--embedding", default=None, metavar="MODE",
                        help=f"with --quantize: the embedding table's mode ({', '.join((*EMBEDDING_MODES, FLOAT))})")
    parser.add_argument("--lm-head", default=None, metavar="MODE",
                        help=f"with --quantize: lm_head's mode ({', '.join((LM_HEAD_AUTO, *WEIGHT_MODES, FLOAT))}; "
                             "auto = the preset's linear mode)")
    parser.add_argument("--int8-rows", action="store_true",
                        help="with --quantize: int8 linears stay int8 rows at every row count (default: linears "
                             "with >= 16 static rows, e.g. an LLM's prefill, get Q8_0 blocks, ggml's faster kernel, "
                             "which needs an AVX-512 host)")


def quantize_from(args):
    """``export(quantize=...)`` from parsed arguments: a preset name, a QuantConfig, or None."""
    return from_options(args.quantize, args.override, args.embedding, args.lm_head,
                        getattr(args, "int8_rows", False))


def override_report(cm) -> list[str]:
    """The lines naming the linears each ``--override`` matched, and the weights ``--calibration``
    weighted (empty without either)."""
    record = cm.report.quantization
    return record.override_lines() if record is not None else []
