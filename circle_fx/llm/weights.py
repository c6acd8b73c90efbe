"""A checkpoint read one tensor at a time: safetensors shards and GGUF files as lazy weights.

``export_llm`` of a 1-3B checkpoint must not hold its float32 model (6-12 GB). Instead:

- the model is *built without weights*: ``from_config`` with every parameter on the meta
  device (accelerate's ``init_empty_weights``; buffers such as RoPE's ``inv_freq`` are computed
  as usual), then each parameter replaced by a zero-stride CPU tensor of its shape (4 bytes:
  ``torch.zeros(()).expand(shape)``), which ``torch.export`` captures like any weight;
- after each capture, :func:`lazify` swaps every such constant for a
  :class:`~circle_fx.lazy.LazyTensor` that reads that parameter from the checkpoint by its name
  (the graph keeps each parameter's name: ``CONSTANT_NAMES``); the passes defer their work on it
  and the quantizers / writer read it when they pack or write it (see :mod:`circle_fx.lazy`);
- the eager checks ``export_llm`` runs before capturing (how the model uses its cache) need
  real numbers: they run on a *check copy*, the same configuration with random weights and
  fewer layers (one of each layer type), a smaller vocabulary and MLP — what those checks test
  is the model's code (its cache calls, positions, masks), not the weights' values. The cache
  shapes of the full model are read by running its prefill wrapper under ``FakeTensorMode``.

Reading: safetensors by ``pread`` of each tensor's byte range (no memory map: mapped pages
count as the process's memory once touched, 12 GB for a 3B model), row slices for the
packers; GGUF through gguf-py's ``GGUFReader`` (a memory map, released after each tensor) and
``gguf.quants.dequantize``, tensor by tensor, with transformers' own GGUF name mapping
(``get_gguf_hf_weights_map``) and tensor processor (Llama's q/k row permutation), so the values
are transformers' GGUF load's, bit for bit.

Everything that can be wrong with the files is checked when the checkpoint is opened, before
anything is captured or written (:func:`open_checkpoint`): a missing shard, a truncated file, a
tensor of a type this module cannot read, a tensor the model needs that is missing or has
another shape than the config gives. Each is one :class:`~circle_fx.errors.InputError` naming
the file and the tensor.
"""
from __future__ import annotations

import copy
import json
import mmap
import os
import struct

import numpy as np
import torch

from ..errors import InputError
from ..lazy import LazyTensor

#: the attribute of a weightless model that holds its :class:`LazyCheckpoint`
ATTR = "_circle_fx_checkpoint"

_ST_DTYPES = {"F32": (np.float32, torch.float32), "F16": (np.float16, torch.float16),
              "BF16": (np.uint16, torch.bfloat16), "F64": (np.float64, torch.float64)}


class SafetensorsWeights:
    """The tensors of a ``save_pretrained`` directory (one ``model.safetensors`` or the shards
    an index names), their headers read and checked up front, values read on demand."""

    def __init__(self, directory: str):
        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        if os.path.isfile(index):
            try:
                weight_map = json.load(open(index))["weight_map"]
            except (OSError, ValueError, KeyError) as e:
                raise InputError(f"{index}: not a safetensors index ({e})") from None
        elif os.path.isfile(single):
            weight_map = None
        else:
            raise InputError(f"{directory}: no model.safetensors or model.safetensors.index.json")
        files = sorted(set(weight_map.values())) if weight_map else ["model.safetensors"]
        self.entries: dict[str, tuple] = {}  # name -> (path, np dtype, torch dtype, shape, start)
        for f in files:
            path = os.path.join(directory, f)
            if not os.path.isfile(path):
                first = next(k for k, v in weight_map.items() if v == f)
                raise InputError(f"{path}: missing shard (the index puts {first!r} and "
                                 f"{sum(v == f for v in weight_map.values()) - 1} more tensors in it)")
            self._read_header(path)
        if weight_map:
            for name, f in weight_map.items():
                if name not in self.entries:
                    raise InputError(f"{os.path.join(directory, f)}: has no tensor {name!r} (the index says it does)")

    def _read_header(self, path: str) -> None:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if n is None or 8 + n > size:
                raise InputError(f"{path}: truncated safetensors file (header of {n} bytes, file of {size})")
            try:
                header = json.loads(fh.read(n))
            except ValueError as e:
                raise InputError(f"{path}: bad safetensors header: {e}") from None
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info.get("dtype") not in _ST_DTYPES:
                raise InputError(f"{path}: tensor {name!r} has dtype {info.get('dtype')}, which circle_fx cannot "
                                 f"read (it reads {', '.join(_ST_DTYPES)})")
            start, end = info["data_offsets"]
            if base + end > size:
                raise InputError(f"{path}: truncated: tensor {name!r} needs bytes {base + start}..{base + end}, "
                                 f"the file has {size}")
            np_dt, t_dt = _ST_DTYPES[info["dtype"]]
            self.entries[name] = (path, np_dt, t_dt, tuple(info["shape"]), base + start)

    def names(self):
        return self.entries.keys()

    def shape(self, name: str) -> tuple:
        return self.entries[name][3]

    def where(self, name: str) -> str:
        return f"{self.entries[name][0]}: {name}"

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``name`` as float32 (one ``pread``, no mapping)."""
        path, np_dt, t_dt, shape, offset = self.entries[name]
        rows = shape[0] if shape else 1
        stop = rows if stop is None else stop
        per_row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        arr = np.empty(((stop - start) * per_row,), np_dt)
        with open(path, "rb") as fh:
            fh.seek(offset + start * per_row * arr.itemsize)
            if fh.readinto(memoryview(arr).cast("B")) != arr.nbytes:
                raise InputError(f"{path}: truncated while reading tensor {name!r}")
        t = torch.from_numpy(arr)
        if t_dt is torch.bfloat16:
            t = t.view(torch.bfloat16)
        t = t.to(torch.float32).reshape(((stop - start), *shape[1:]) if shape else ())
        return t


class GGUFWeights:
    """The tensors of a ``.gguf`` file under transformers' parameter names, each dequantized on
    its own by gguf-py and processed by transformers' tensor processor for the architecture."""

    #: processors that map one GGUF tensor to one parameter (others merge or split tensors)
    PER_TENSOR = ("TensorProcessor", "LlamaTensorProcessor")

    def __init__(self, path: str, model, config: dict):
        from gguf import GGUFReader
        from gguf.quants import _type_traits
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                              get_gguf_hf_weights_map, read_field)

        self.path = path
        try:
            self.reader = GGUFReader(path)
        except Exception as e:  # gguf-py raises ValueError / struct errors on a bad or cut file
            raise InputError(f"{path}: not a readable GGUF file: {type(e).__name__}: {e}") from None
        arch = read_field(self.reader, "general.architecture")[0]
        cls = TENSOR_PROCESSORS.get(arch, TensorProcessor)
        if cls.__name__ not in self.PER_TENSOR:
            raise NotImplementedError(f"{cls.__name__} maps GGUF tensors to parameters other than one by one")
        self.processor = cls(config=config)
        mapping = get_gguf_hf_weights_map(model, self.processor)
        readable = {"F32", "F16", *(t.name for t in _type_traits)}
        self.entries: dict[str, object] = {}
        for t in self.reader.tensors:
            if t.name not in mapping:
                continue
            if t.tensor_type.name not in readable:
                raise InputError(f"{path}: tensor {t.name!r} ({mapping[t.name]}) is of GGML type {t.tensor_type.name}, "
                                 f"which circle_fx cannot read (gguf-py dequantizes {', '.join(sorted(readable))})")
            self.entries[mapping[t.name]] = t

    def names(self):
        return self.entries.keys()

    def shape(self, name: str) -> tuple:
        return tuple(int(d) for d in reversed(self.entries[name].shape.tolist()))

    def where(self, name: str) -> str:
        return f"{self.path}: {self.entries[name].name} ({name})"

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        from gguf.quants import dequantize

        t = self.entries[name]
        w = dequantize(t.data, t.tensor_type)
        w = self.processor.process(weights=w, name=t.name, tensor_key_mapping={}, parsed_parameters={}).weights
        out = torch.from_numpy(np.array(w, np.float32).reshape(self.shape(name)))
        try:  # the memory map's pages of this tensor leave the process's resident set
            self.reader.data._mmap.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):
            pass
        return out if start == 0 and stop is None else out[start:stop].clone()


class LazyCheckpoint:
    """What :func:`lazify` and ``export_llm`` need of a checkpoint opened without its weights."""

    def __init__(self, path, weights, names: dict[str, str], params: dict, check_model_factory):
        self.path, self.weights, self.names = path, weights, names  # param name -> checkpoint name
        #: each placeholder's storage address -> its parameter name (what :func:`lazify` finds)
        self.placeholders = {p.untyped_storage().data_ptr(): name for name, p in params.items()}
        self._params = params  # keeps the placeholders (and so their addresses) alive
        self._check_model, self._factory = None, check_model_factory

    def check_model(self):
        """The random-weight copy the eager checks run on (built once)."""
        if self._check_model is None:
            self._check_model = self._factory()
        return self._check_model

    def tensor(self, param: str, dtype: torch.dtype) -> LazyTensor:
        name = self.names[param]
        shape = self.weights.shape(name)
        w = self.weights
        read = (lambda: w.read(name)) if dtype == torch.float32 else (lambda: w.read(name).to(dtype))
        rows = (lambda i, j: w.read(name, i, j)) if isinstance(w, SafetensorsWeights) and dtype == torch.float32 \
            and len(shape) >= 1 else None
        return LazyTensor(shape, dtype, read, w.where(name), rows=rows, key=("checkpoint", self.path, name))


def _placeholder(p: torch.Tensor) -> torch.nn.Parameter:
    """A CPU tensor of ``p``'s shape and dtype holding 4 bytes (every stride 0)."""
    return torch.nn.Parameter(torch.zeros((), dtype=p.dtype).expand(p.shape), requires_grad=False)


def weightless(config):
    """``from_config`` with no parameter memory: ``(model, {param name: placeholder})``; tied
    parameters stay one placeholder (named once, as ``named_parameters`` does)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # from_pretrained ties after loading; on the meta device it has not yet
    made, names = {}, {}
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                made[id(p)] = _placeholder(p)
            module._parameters[key] = made[id(p)]
    for name, p in model.named_parameters():
        names[name] = p
    return model.eval(), names


def check_config(config):
    """The configuration the eager checks run on: one layer of each type the model has (in
    their first order), MLP and vocabulary shrunk; attention geometry (heads, head size, RoPE,
    windows) unchanged, since that is what the checks are about."""
    cfg = copy.deepcopy(config)
    text = getattr(cfg, "get_text_config", lambda: cfg)()
    kinds = getattr(text, "layer_types", None)
    n = text.num_hidden_layers
    if kinds:
        k = max(kinds.index(kind) for kind in set(kinds)) + 1
        text.layer_types = list(kinds[:k])
        text.num_hidden_layers = k
    else:
        text.num_hidden_layers = min(n, 2)
    for attr in ("intermediate_size", "moe_intermediate_size", "block_ff_dim"):
        if isinstance(getattr(text, attr, None), int):
            setattr(text, attr, min(getattr(text, attr), 64))
    if isinstance(getattr(text, "vocab_size", None), int) and text.vocab_size > 256:
        text.vocab_size = 256
        for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):
            v = getattr(text, attr, None)
            if isinstance(v, int) and v >= 256 or isinstance(v, list) and any(x >= 256 for x in v):
                setattr(text, attr, None)
    return cfg


def _random_model(config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def open_checkpoint(path: str, where: str, kw: dict):
    """The weightless model of checkpoint ``path`` with its :class:`LazyCheckpoint` as ``ATTR``,
    every weight checked against the config (present, same shape) before returning; or None
    when this checkpoint is not one this module reads lazily (no safetensors, a GGUF architecture
    whose tensors transformers merges or splits): the caller then loads it whole."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(where, **kw)
    model, params = weightless(config)
    if kw.get("gguf_file"):
        try:
            weights = GGUFWeights(path, model, config.to_dict())
        except NotImplementedError:
            return None
    elif any(os.path.isfile(os.path.join(where, f)) for f in ("model.safetensors", "model.safetensors.index.json")):
        weights = SafetensorsWeights(where)
    else:
        return None
    names = {}
    have = set(weights.names())
    for name, p in params.items():
        hit = name if name in have else next((c for c in (f"model.{name}", name.removeprefix("model.")) if c in have),
                                             None)
        if hit is None:
            raise InputError(f"{path}: the config's model needs tensor {name!r} {list(p.shape)}, which the checkpoint "
                             f"does not have (config and weights do not match)")
        if tuple(weights.shape(hit)) != tuple(p.shape):
            raise InputError(f"{weights.where(hit)}: shape {list(weights.shape(hit))}, but the config's model has "
                             f"{list(p.shape)} for {name!r} (config and weights do not match)")
        names[name] = hit
    try:
        model.generation_config = GenerationConfig.from_pretrained(where, **kw)
    except Exception:  # none saved: the config's ids, as from_pretrained does
        model.generation_config = GenerationConfig.from_model_config(config)
    model.config._name_or_path = where
    model.name_or_path = where
    setattr(model, ATTR, LazyCheckpoint(path, weights, names, params, lambda: _random_model(check_config(config))))
    return model


def lazify(program, checkpoint: LazyCheckpoint) -> int:
    """Replace each captured placeholder weight of ``program`` by its checkpoint's
    :class:`LazyTensor`; returns how many. Placeholders are known by their storage (each
    parameter's own 4 bytes), so no name guessing: a constant the model made in its forward
    stays what it is."""
    from ..program import fetch_attr

    gm = program.gm
    done = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        t = fetch_attr(gm, node.target)
        if not isinstance(t, torch.Tensor) or isinstance(t, LazyTensor) or t.is_meta or any(t.stride()):
            continue
        name = checkpoint.placeholders.get(t.untyped_storage().data_ptr())
        if name is None:
            continue
        owner, _, attr = node.target.rpartition(".")
        setattr(fetch_attr(gm, owner) if owner else gm, attr, checkpoint.tensor(name, t.dtype))
        done += 1
    return done
