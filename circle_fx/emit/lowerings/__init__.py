"""Built-in lowerings, grouped by kind; importing this package registers them all."""
from . import attention, elementwise, linear, norm, reduce, shape  # noqa: F401
from . import clamp, gather, repeat, topk  # noqa: F401  (model families: MoE routing, GPT-OSS)
from . import dynamic  # noqa: F401  (sym_size in dynamic-shape graphs)
