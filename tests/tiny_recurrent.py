"""The Hugging Face layout of recurrent families other than Qwen3.5's Gated DeltaNet: Nemotron-H (Mamba 2 layers beside
attention, MLP and mixture-of-experts layers, `backbone.*`), its config keys and tensors named and shaped as NVIDIA
publishes them (conv weights (C, 1, K), each expert on its own). tiny_nextn.py draws the checkpoint, its MTP layer
with it."""

from __future__ import annotations


def nemotron_h_config(vocab: int, pattern: str = "M*M-ME", hidden: int = 64) -> dict:
    """Nemotron-H's config keys as NVIDIA publishes them (Nemotron 3's: relu² MLPs and experts)."""
    return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": 2 * hidden, "max_position_embeddings": 4096,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False,
            "mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_proj_bias": False, "ssm_state_size": 16,
            "conv_kernel": 4, "n_groups": 2, "chunk_size": 128, "mlp_bias": False, "mlp_hidden_act": "relu2",
            "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-5, "use_bias": False, "use_conv_bias": True,
            "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern), "n_routed_experts": 4,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "time_step_limit": [0.0, float("inf")], "residual_in_fp32": False,
            "rescale_prenorm_residual": True, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
            "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": 0}


def nemotron_h_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inner = cfg["mamba_num_heads"] * cfg["mamba_head_dim"]
    conv = inner + 2 * cfg["n_groups"] * cfg["ssm_state_size"]
    shapes = {"backbone.embeddings.weight": (cfg["vocab_size"], h), "backbone.norm_f.weight": (h,),
              "lm_head.weight": (cfg["vocab_size"], h)}
    for i, kind in enumerate(cfg["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}."
        shapes[p + "norm.weight"] = (h,)
        p += "mixer."
        if kind == "M":
            shapes.update({p + "in_proj.weight": (inner + conv + cfg["mamba_num_heads"], h),
                           p + "conv1d.weight": (conv, 1, cfg["conv_kernel"]), p + "conv1d.bias": (conv,),
                           p + "dt_bias": (cfg["mamba_num_heads"],), p + "A_log": (cfg["mamba_num_heads"],),
                           p + "D": (cfg["mamba_num_heads"],), p + "norm.weight": (inner,),
                           p + "out_proj.weight": (h, inner)})
        elif kind == "*":
            shapes.update({p + "q_proj.weight": (heads * hd, h), p + "k_proj.weight": (kv * hd, h),
                           p + "v_proj.weight": (kv * hd, h), p + "o_proj.weight": (h, heads * hd)})
        elif kind == "-":
            shapes.update({p + "up_proj.weight": (cfg["intermediate_size"], h),
                           p + "down_proj.weight": (h, cfg["intermediate_size"])})
        else:  # "E": routed experts and a shared one, relu² MLPs each
            experts, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            shared = cfg["moe_shared_expert_intermediate_size"]
            shapes.update({p + "gate.weight": (experts, h), p + "gate.e_score_correction_bias": (experts,),
                           p + "shared_experts.up_proj.weight": (shared, h),
                           p + "shared_experts.down_proj.weight": (h, shared)})
            for e in range(experts):
                shapes.update({p + f"experts.{e}.up_proj.weight": (inter, h),
                               p + f"experts.{e}.down_proj.weight": (h, inter)})
    return shapes
