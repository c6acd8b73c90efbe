"""Mixture-of-experts ``transformers`` models export with their DEFAULT settings.

transformers' default experts implementation (``grouped_mm``) sorts tokens by expert at
run time; ``circle_fx.export`` switches a model to ``batched_mm`` while capturing (see
``circle_fx.transformers_compat``). Each test builds a tiny random MoE causal LM exactly as
a user would (no ``experts_implementation`` argument), exports it, runs it in onert and
compares with eager, and checks the model came back exactly as it was (weights bit-identical,
config attributes identical) and that the summary says what was switched.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers

import circle_fx
from circle_fx.errors import UnsupportedOpError

from families import DECODER, SEED, SEQ_LEN, VOCAB

RTOL, ATOL = 1e-4, 1e-5

MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
                     max_position_embeddings=131072)),
}


def build(name: str) -> torch.nn.Module:
    config_cls, model_cls, overrides = MOE[name]
    torch.manual_seed(SEED)
    config = getattr(transformers, config_cls)(**{**DECODER, **overrides})
    return getattr(transformers, model_cls)(config).eval()


def config_state(model: torch.nn.Module) -> dict:
    """Every config object the model's modules hold, attribute by attribute (deep copies)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    return {k: copy.deepcopy(dict(vars(c))) for k, c in configs.items()}


def weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone().numpy().tobytes() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", list(MOE))
def test_moe_exports_with_default_experts_and_matches_eager(name):
    model = build(name)
    assert model.config._experts_implementation == "grouped_mm"  # the default this test is about
    ids = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits.numpy()
    configs, state = config_state(model), weights(model)

    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False})

    assert config_state(model) == configs, "config attributes changed"
    assert weights(model) == state, "weights changed"
    assert model.config._experts_implementation == "grouped_mm"
    summary = cm.summary()
    assert "'grouped_mm' -> 'batched_mm'" in summary and "restored" in summary, summary
    hist = cm.op_histogram()
    assert hist["BATCH_MATMUL"] > 0 and hist["GATHER"] > 0, summary
    out = cm.run(ids)[0]
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=f"{name}: max diff {np.abs(out - ref).max():.3g}")
    assert float(np.abs(ref).max()) > 100 * ATOL and float(ref.std()) > 10 * ATOL
    # eager afterwards still uses the user's implementation and gives the same numbers
    with torch.no_grad():
        np.testing.assert_array_equal(model(ids, use_cache=False).logits.numpy(), ref)


def test_switching_off_names_the_remedy_and_leaves_the_model_alone():
    model = build("mixtral")
    ids = torch.randint(0, VOCAB, (1, SEQ_LEN))
    configs = config_state(model)
    with pytest.raises(UnsupportedOpError) as info:
        circle_fx.export(model, (ids,), example_kwargs={"use_cache": False}, switch_implementations=False)
    message = str(info.value)
    assert "grouped_mm" in message and "batched_mm" in message and "switch_implementations" in message, message
    assert config_state(model) == configs


def test_model_is_restored_when_the_export_fails():
    model = build("qwen3_moe")
    configs, state = config_state(model), weights(model)
    with pytest.raises(circle_fx.CircleFxError):
        circle_fx.export(model, (torch.zeros(1, SEQ_LEN),), example_kwargs={"use_cache": False})  # float ids
    assert config_state(model) == configs and weights(model) == state


def test_user_choice_of_batched_mm_is_kept_without_a_note():
    config_cls, model_cls, overrides = MOE["mixtral"]
    torch.manual_seed(SEED)
    config = getattr(transformers, config_cls)(**{**DECODER, **overrides}, experts_implementation="batched_mm")
    model = getattr(transformers, model_cls)(config).eval()
    cm = circle_fx.export(model, (torch.randint(0, VOCAB, (1, SEQ_LEN)),), example_kwargs={"use_cache": False})
    assert cm.report.notes == [] and "note:" not in cm.summary()


def test_flex_attention_is_switched_to_sdpa_and_restored():
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER)).eval()
    ids = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits.numpy()  # sdpa
    model.set_attn_implementation("flex_attention")
    configs = config_state(model)
    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False})
    assert config_state(model) == configs and model.config._attn_implementation == "flex_attention"
    assert "'flex_attention' -> 'sdpa'" in cm.summary(), cm.summary()
    np.testing.assert_allclose(cm.run(ids)[0], ref, rtol=RTOL, atol=ATOL)


DEEPSEEK_V3 = dict(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, moe_intermediate_size=32,
                   first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                   v_head_dim=16, n_shared_experts=1, num_key_value_heads=4)


def test_deepseek_v3_group_limited_routing_matches_eager():
    """n_group/topk_group: top-2 sum per group, top-k groups, scatter into a group mask,
    ``masked_fill(~mask, -inf)``, top-k experts, ``gather`` of their scores. The zeros_like /
    scatter / gather / masked_fill (and MLA's new_empty / copy) decompositions come from the
    general decomposition pass (``passes/decompose_unlowered.py``)."""
    torch.manual_seed(SEED)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**{**DECODER, **DEEPSEEK_V3})).eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # the router starts at zero weight: every score ties and routing is moot
        for m in model.modules():
            if type(m).__name__ == "DeepseekV3TopkRouter":
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen))
                m.e_score_correction_bias.copy_(0.1 * torch.randn(m.e_score_correction_bias.shape, generator=gen))
    ids = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=gen)
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits.numpy()
    configs, state = config_state(model), weights(model)
    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False})
    assert config_state(model) == configs and weights(model) == state
    assert "'grouped_mm' -> 'batched_mm'" in cm.summary()
    np.testing.assert_allclose(cm.run(ids)[0], ref, rtol=RTOL, atol=ATOL)


def test_bitwise_not_of_a_mask_is_logical_not():
    from onert_eager import Fn, assert_onert_matches_eager

    cm = assert_onert_matches_eager(Fn(lambda x: (x * (~(x > 0)).float(), ~(x < 0.5))), (torch.randn(3, 5),),
                                    rtol=0, atol=0)
    assert cm.op_histogram()["LOGICAL_NOT"] == 2


def test_causal_lm_with_use_cache_exports_as_it_is_and_is_restored():
    """A causal LM as from_pretrained gives it (config.use_cache=True: its forward returns a
    Cache object, which torch.export cannot flatten) exports with no kwargs: use_cache is off
    for the capture only, the summary says so, and the model is restored."""
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER)).eval()
    assert model.config.use_cache is True
    ids = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(SEED))
    cm = circle_fx.export(model, (ids,))
    assert model.config.use_cache is True and "use_cache True -> False" in cm.summary()
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(ids)[0], model(ids).logits.numpy(), rtol=RTOL, atol=ATOL)
