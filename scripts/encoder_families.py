"""Every vision, audio and encoder family of the installed ``transformers``, as tiny random models.

The list is not hand-picked: one row per (task, model type) of transformers' auto mappings for
image classification, semantic segmentation, object detection, audio classification, CTC,
masked LM and seq2seq LM (:data:`TASKS`). A family's config is built like the decoders'
(``scripts/hf_families.py``): its defaults with the :data:`hf_families.TINY` sizes plus the
vision / audio sizes of :data:`TINY_VISION` (per-stage lists keep their length, stages get one
block and small widths), sub-configs (a backbone, an encoder) shrunk the same way. When that
tiny config does not build or run in eager, the family's *default* config with two layers is
tried (the row says which config ran; a detector's queries are 10 in both, and a timm ResNet
backbone, DETR's default, is transformers' own ResNet: timm is not installed), so a family is
only skipped when neither builds.

The example input is what the class's ``main_input_name`` asks for, sized from the config:
``pixel_values [1, C, S, S]`` (S: the config's ``image_size``, else 64), ``input_values [1, 1600]``
(0.1 s of 16 kHz audio), ``input_features`` in the layout the config implies (Whisper's
``[1, mels, 2 * max_source_positions]``, AST's ``[1, max_length, mels]``, W2V-BERT's
``[1, T, feature_size]``), ``input_ids [1, 8]`` (+ ``decoder_input_ids [1, 4]`` and an all-ones ``attention_mask`` for seq2seq).

Used by ``scripts/encoder_support.py`` (docs/encoder-support.md).
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import torch

import hf_families as hf

#: task -> transformers' auto mapping holding its (model type -> class) rows
TASKS = {
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "semantic-segmentation": "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
    "object-detection": "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
    "audio-classification": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "ctc": "MODEL_FOR_CTC_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
}

IMAGE = 64
AUDIO_SAMPLES = 1600
SEQ = 8
DECODER_SEQ = 4

#: vision / audio sizes (scalars), applied to the attributes the default config has
TINY_VISION = dict(
    image_size=IMAGE, embedding_size=16, embed_dim=24, num_labels=3, num_queries=10, d_model=64,
    encoder_hidden_dim=32, decoder_hidden_dim=32, backbone_hidden_size=32,
    num_mel_bins=32, max_source_positions=16, max_length=64, conv_dim=(32, 32), conv_stride=(5, 4),
    conv_kernel=(10, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
    num_feat_extract_layers=2, tdnn_dim=(32, 32), tdnn_kernel=(5, 3), tdnn_dilation=(1, 2), xvector_output_dim=32,
    classifier_proj_size=32, proj_codevector_dim=32, codevector_dim=32,
)
#: per-stage list fields: each stage one block (depths) or a small width (the rest)
STAGE_LISTS = {"depths": lambda i, v: 1, "hidden_sizes": lambda i, v: 8 * 2 ** i, "neck_hidden_sizes":
               lambda i, v: 8 * 2 ** i, "widths": lambda i, v: 8 * 2 ** i, "embed_dims": lambda i, v: 8 * 2 ** i,
               "num_encoder_blocks": lambda i, v: 1}


@dataclass(frozen=True)
class Family:
    """``model_type`` is the row key ``task/model type`` (what the run cache is keyed by)."""
    model_type: str
    model_class: str
    skip: str | None = None

    @property
    def task(self) -> str:
        return self.model_type.split("/", 1)[0]

    @property
    def config_type(self) -> str:
        return self.model_type.split("/", 1)[1]


def enumerate_families() -> list[Family]:
    import transformers
    from transformers.models.auto import modeling_auto

    out = []
    for task, mapping in TASKS.items():
        for model_type, cls_name in sorted(getattr(modeling_auto, mapping).items()):
            if isinstance(cls_name, (list, tuple)):  # several classes for one type: the first
                cls_name = cls_name[0]
            skip = None if hasattr(transformers, cls_name) else f"{cls_name} is not importable from this build"
            out.append(Family(f"{task}/{model_type}", cls_name, skip))
    return out


def _shrunk(default) -> dict:
    """The tiny overrides of ``default``'s fields: TINY, TINY_VISION, per-stage lists."""
    kwargs = {k: v for k, v in {**hf.TINY, **TINY_VISION}.items() if hf._has_attr(default, k)}
    for k, fn in STAGE_LISTS.items():
        v = getattr(default, k, None)
        if isinstance(v, (list, tuple)) and v and all(isinstance(e, int) for e in v):
            kwargs[k] = [fn(i, e) for i, e in enumerate(v)]
    if "embed_dim" in kwargs and isinstance(getattr(default, "num_heads", None), (list, tuple)):
        kwargs["embed_dim"] = 8 * max(default.num_heads[0], 1)  # Swin: stage widths divide by heads
    if isinstance(getattr(default, "image_size", None), (list, tuple)):
        kwargs["image_size"] = [IMAGE] * len(default.image_size)
    for k in ("conv_dim", "conv_stride", "conv_kernel", "tdnn_dim", "tdnn_kernel", "tdnn_dilation"):
        v = getattr(default, k, None)
        if k in kwargs and isinstance(v, (list, tuple)):
            kwargs[k] = list(kwargs[k])
    stages = [getattr(default, k) for k in STAGE_LISTS if isinstance(getattr(default, k, None), (list, tuple))]
    if "num_hidden_layers" in kwargs and any(len(v) == getattr(default, "num_hidden_layers", None) for v in stages):
        del kwargs["num_hidden_layers"]  # it counts the stages (ConvNeXt's num_stages, Swin's num_layers)
    layers, tiny_layers = getattr(default, "num_hidden_layers", None), kwargs.get("num_hidden_layers")
    if isinstance(layers, int) and tiny_layers and tiny_layers < layers:
        for k, v in vars(default).items():  # indices of layers (DPT's backbone_out_indices): as many
            if k.endswith("out_indices") and isinstance(v, (list, tuple)) and v and all(   # layers as
                    isinstance(e, int) and 0 <= e < layers for e in v):           # indices, same depth fractions
                n = max(kwargs["num_hidden_layers"], len(set(v)))
                kwargs["num_hidden_layers"] = n
                new = [e * n // layers for e in v]
                kwargs[k] = new if len(set(new)) == len(set(v)) else list(range(n - len(v), n))
    if isinstance(getattr(default, "decoder_in_channels", None), (list, tuple)) and "encoder_hidden_dim" in kwargs \
            and set(default.decoder_in_channels) == {default.encoder_hidden_dim}:
        kwargs["decoder_in_channels"] = [kwargs["encoder_hidden_dim"]] * len(default.decoder_in_channels)  # RT-DETR
    return kwargs


#: token ids a model reads from its config with defaults in the full vocabulary: moved into
#: the tiny one (ShieldGemma 2 scores its yes / no tokens, ids 10784 and 3771 by default)
TOKEN_INDICES = {"ShieldGemma2Config": {"yes_token_index": 5, "no_token_index": 6}}
#: parts a family's default config leaves out (its checkpoints' configs have them), given small
#: values in both configs: Sapiens 2's segmentation head (None by default: the model cannot be built)
CONFIG_PARTS = {"Sapiens2Config": {"head_config": {"upsample_out_channels": [16, 16], "use_pixel_shuffle": False,
                                                   "conv_out_channels": [16]}}}


def _widths_map(old_sub, new_sub) -> dict[int, int]:
    """A shrunk backbone's stage widths, old -> new (the parent's lists of them follow)."""
    old, new = getattr(old_sub, "hidden_sizes", None), getattr(new_sub, "hidden_sizes", None)
    if not (isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new)):
        return {}
    return dict(zip(old, new))


def _config(cls, tiny: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = cls()
        if tiny:
            kwargs = _shrunk(default)
            kwargs.update(hf._tiny_sub_configs(default))
            for key in getattr(default, "sub_configs", {}):  # shrink the vision parts of sub-configs too
                sub = kwargs.get(key) or getattr(default, key, None)
                if sub is not None and hasattr(sub, "to_dict"):
                    try:
                        kwargs[key] = type(sub)(**{**sub.to_dict(), **_shrunk(sub)})
                    except Exception:  # noqa: BLE001 - keep the TINY-only part
                        continue
                    # the parent's lists of the backbone's widths (RT-DETR's encoder_in_channels)
                    widths = _widths_map(getattr(default, key, None), kwargs[key])
                    for k, v in vars(default).items():  # (distinct, increasing: stage widths)
                        if k not in kwargs and isinstance(v, (list, tuple)) and v and list(v) == sorted(set(v)) and all(
                                isinstance(e, int) and e in widths for e in v):
                            kwargs[k] = [widths[e] for e in v]
            kwargs.update(TOKEN_INDICES.get(cls.__name__, {}))
        else:
            kwargs = {k: 2 for k in ("num_hidden_layers", "encoder_layers", "decoder_layers")
                      if hf._has_attr(default, k) and isinstance(getattr(default, k), int) and getattr(default, k) > 2}
            if isinstance(getattr(default, "num_queries", None), int) and default.num_queries > TINY_VISION["num_queries"]:
                # a detector's top-k picks its queries among the encoder's anchors: a 64-pixel image
                # has fewer than D-FINE's 300 (RT-DETR-style two-stage selection)
                kwargs["num_queries"] = TINY_VISION["num_queries"]
        kwargs.update(CONFIG_PARTS.get(cls.__name__, {}))
        bc = getattr(default, "backbone_config", None)
        if getattr(bc, "model_type", None) == "timm_backbone":
            # DETR and its kin default to a timm ResNet (timm is not installed here): transformers'
            # own ResNet instead, with the same four stages, as a user without timm builds them
            import transformers

            resnet = transformers.ResNetConfig(out_indices=list(bc.out_indices or [1, 2, 3, 4]))
            kwargs["backbone_config"] = type(resnet)(**{**resnet.to_dict(), **_shrunk(resnet)}) if tiny else resnet
        return hf._construct(cls, kwargs, keep=set())


#: config fields that name an audio model's feature width (mel bins, filterbank features)
FEATURE_FIELDS = ("num_mel_bins", "feature_size", "input_dim", "input_feat_per_channel", "n_mels",
                  "num_features", "input_feature_size")


def example_candidates(model, fam: Family):
    """Example inputs to try in turn: :func:`example_inputs`' guess, then for an audio model
    (``input_values`` / ``input_features``) other layouts of its feature width ([1, T, F],
    [1, F, T], raw samples), since the configs do not say which one the model reads."""
    first = example_inputs(model, fam)
    yield first
    name = getattr(model, "main_input_name", "input_ids")
    if name not in ("input_values", "input_features"):
        return
    cfg = model.config
    subs = [getattr(cfg, k, None) for k in getattr(cfg, "sub_configs", {})]  # Parakeet: encoder_config
    widths = [getattr(c, k) for c in [cfg, *subs] if c is not None for k in FEATURE_FIELDS
              if isinstance(getattr(c, k, None), int)]
    if isinstance(getattr(cfg, "input_feat_per_channel", None), int) and isinstance(getattr(cfg, "input_channels", None), int):
        widths.append(cfg.input_feat_per_channel * cfg.input_channels)
    lengths = [20, getattr(cfg, "max_length", 64) if isinstance(getattr(cfg, "max_length", None), int) else 64]
    gen = torch.Generator().manual_seed(0)
    seen = {tuple(first[0][0].shape)}
    widths = list(dict.fromkeys(widths + [2 * w for w in widths] + [80, 128, 160]))  # 2x: stacked frames
    shapes = [[1, t, w] for w in widths for t in lengths] + [[1, w, t] for w in widths for t in lengths]
    shapes += [[1, AUDIO_SAMPLES], [1, AUDIO_SAMPLES, 1], [1, 1, AUDIO_SAMPLES]]
    for shape in shapes:
        if tuple(shape) not in seen:
            seen.add(tuple(shape))
            yield (torch.randn(*shape, generator=gen),), {}


def example_inputs(model, fam: Family) -> tuple[tuple, dict]:
    """(positional, keyword) example inputs for the class's main input (see the module doc)."""
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    name = getattr(model, "main_input_name", "input_ids")
    if name == "inputs":  # Perceiver: the same tensors under one name
        name = "pixel_values" if fam.task == "image-classification" else "input_ids"
        args, kwargs = example_inputs_named(model, fam, name, gen)
        return (), {"inputs": args[0], **kwargs}
    return example_inputs_named(model, fam, name, gen)


def example_inputs_named(model, fam: Family, name: str, gen) -> tuple[tuple, dict]:
    cfg = model.config
    if name == "pixel_values" and "spatial_shapes" in inspect.signature(model.forward).parameters:
        # NaFlex (SigLIP 2): flattened patches [B, patches, C * P * P], their grid and mask
        v = getattr(cfg, "vision_config", cfg)
        side = int(v.num_patches ** 0.5)
        patches = side * side
        return (torch.randn(1, patches, v.num_channels * v.patch_size ** 2, generator=gen),), {
            "pixel_attention_mask": torch.ones(1, patches, dtype=torch.long),
            "spatial_shapes": torch.tensor([[side, side]])}
    if name == "pixel_values":
        c = getattr(cfg, "num_channels", 3)
        size = getattr(cfg, "image_size", IMAGE)
        size = list(size) if isinstance(size, (list, tuple)) else [size, size]
        return (torch.randn(1, c, *size, generator=gen),), {}
    if name == "input_values":
        return (torch.randn(1, AUDIO_SAMPLES, generator=gen),), {}
    if name == "input_features":
        mels = getattr(cfg, "num_mel_bins", 80)
        if hasattr(cfg, "max_source_positions"):
            shape = [1, mels, 2 * cfg.max_source_positions]
        elif hasattr(cfg, "max_length"):
            shape = [1, cfg.max_length, mels]
        elif hasattr(cfg, "feature_size"):
            shape = [1, 20, cfg.feature_size]
        else:
            shape = [1, 20, getattr(cfg, "input_feat_per_channel", mels) * getattr(cfg, "input_channels", 1)]
        return (torch.randn(*shape, generator=gen),), {}
    if name != "input_ids":
        raise hf.SkipFamily(f"main input {name!r} has no example here")
    vocab = min(getattr(cfg, "vocab_size", 256) or 256, 256)
    ids = torch.randint(3, vocab, (1, SEQ), generator=gen)
    kwargs = {}
    if fam.task == "seq2seq":
        kwargs["decoder_input_ids"] = torch.randint(3, vocab, (1, DECODER_SEQ), generator=gen)
        if "attention_mask" in inspect.signature(model.forward).parameters:
            # what a tokenizer returns with the ids; LongT5's and Switch Transformers' encoders
            # build a missing mask only outside torch.export (``is_torchdynamo_compiling``)
            kwargs["attention_mask"] = torch.ones(1, SEQ, dtype=torch.long)
    return (ids,), kwargs


def build(fam: Family):
    """(model, config kind, args, kwargs, eager outputs): the tiny config first, the family's
    defaults with two layers when it does not build or run."""
    import transformers

    cls = getattr(transformers, fam.model_class)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg_cls = hf.config_class_for(CONFIG_MAPPING[fam.config_type], fam.model_class)
    errors = []
    for kind in ("tiny", "default, 2 layers"):
        try:
            config = _config(cfg_cls, kind == "tiny")
            for sub in [config, *(getattr(config, k, None) for k in getattr(config, "sub_configs", {}))]:
                if hasattr(sub, "use_cache"):  # a multimodal model's text part caches too
                    sub.use_cache = False
            configs = [config]
            if fam.task == "semantic-segmentation" and isinstance(getattr(config, "out_indices", None), (list, tuple)) \
                    and len(config.out_indices) != 4 and isinstance(getattr(config, "num_hidden_layers", None), int):
                # BEiT-style segmentation reads four backbone layers (tried when the config as it is
                # fails: Sapiens 2's head reads one)
                n = max(4, config.num_hidden_layers)  # stage names follow the layer count: rebuild
                try:
                    configs.append(type(config)(**{**config.to_dict(), "num_hidden_layers": n, "out_features": None,
                                                   "out_indices": list(range(n - 3, n + 1))}))
                except Exception:  # noqa: BLE001 - the config as it is stays the only one
                    pass
            first_error = None
            for config in configs:
                try:
                    model, args, kwargs, ref = _run(cls, config, fam)
                except Exception as e:  # noqa: BLE001 - the next config; report the first error
                    first_error = first_error or e
                    continue
                return model, kind, args, kwargs, ref
            raise first_error
        except hf.SkipFamily:
            raise
        except Exception as e:  # noqa: BLE001 - try the next config, report both
            errors.append(f"{kind}: {type(e).__name__}: {str(e).strip().splitlines()[0][:150] if str(e).strip() else ''}")
    raise hf.SkipFamily("does not build / run in eager (" + "; ".join(errors) + ")")


def _run(cls, config, fam: Family):
    """(model, args, kwargs, eager outputs) of ``cls(config)`` on the first example input that runs."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(config).eval()
    languages = getattr(config, "languages", None)
    if hasattr(model, "set_default_language") and languages:  # X-MOD: one adapter per language
        model.set_default_language(languages[0])
    params = inspect.signature(model.forward).parameters
    first_error = None
    for args, kwargs in example_candidates(model, fam):
        if "return_dict" in params:
            kwargs.setdefault("return_dict", False)
        if "use_cache" in params:  # no cache object in the outputs (torch.export cannot return one)
            kwargs.setdefault("use_cache", False)
        try:
            with torch.no_grad():
                ref = model(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the next layout of the input; report the first
            first_error = first_error or e
            continue
        return model, args, kwargs, ref
    raise first_error


def tensors(out) -> list[torch.Tensor]:
    """The tensor leaves of a model output, in order."""
    import torch.utils._pytree as pytree

    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
