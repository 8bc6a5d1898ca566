"""The configs of each nextn family's tiny checkpoint, as its publisher writes them (scaled down): tiny_nextn.py
draws the checkpoints."""

from __future__ import annotations

from tiny_recurrent import nemotron_h_config

SPARSE = {"index_n_heads": 4, "index_head_dim": 16, "index_topk": 8}  # DeepSeek's sparse attention: an indexer
MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
       "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
       "norm_topk_prob": True, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def config(family: str, vocab: int, hidden: int = 64, layers: int = 3) -> dict:
    common = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden,
              "num_hidden_layers": layers, "num_attention_heads": 4, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
              "num_nextn_predict_layers": 1, "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": 0,
              "hidden_act": "silu", **MOE}
    if family == "deepseek_v3":
        return {**common, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 16, "v_head_dim": 16, "moe_layer_freq": 1,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                 "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    if family == "deepseek_v32":  # DeepSeek-V3.2: V3's keys and the indexer's; the indexer picks 8 keys per query
        return {**config("deepseek_v3", vocab, hidden, layers), "architectures": ["DeepseekV32ForCausalLM"],
                "model_type": "deepseek_v32", "ep_size": 1, **SPARSE}
    if family == "glm_moe_dsa":  # GLM-5, as zai-org publishes its config: DeepSeek-V3.2's layers
        return {**config("deepseek_v3", vocab, hidden, layers), "architectures": ["GlmMoeDsaForCausalLM"],
                "model_type": "glm_moe_dsa", "head_dim": 16, "qk_head_dim": 24, "rope_interleave": True,
                "indexer_rope_interleave": True, "rope_scaling": None,
                "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "dtype": "float32", **SPARSE}
    if family == "glm4_moe_lite":  # GLM-4.7-Flash, as zai-org publishes its config
        return {**common, "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
                "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 16, "v_head_dim": 16, "n_group": 1, "topk_group": 1, "rope_scaling": None,
                "partial_rotary_factor": 1.0, "routed_scaling_factor": 1.8, "dtype": "float32"}
    if family == "mimo":  # MiMo-7B (dense, Qwen2's layers), as Xiaomi publishes its config
        return {**{k: v for k, v in common.items() if k not in MOE}, "architectures": ["MiMoForCausalLM"],
                "model_type": "mimo", "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True,
                "rope_theta": 640000.0, "rope_scaling": None, "use_sliding_window": False}
    if family == "exaone_moe":  # K-EXAONE: sliding-window layers, then a global one; the first dense
        kinds = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        return {**{k: v for k, v in common.items() if k not in MOE}, "architectures": ["ExaoneMoEForCausalLM"],
                "model_type": "exaone_moe", "num_key_value_heads": 2, "head_dim": 32, "moe_intermediate_size": 32,
                "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "n_group": 1, "topk_group": 1,
                "routed_scaling_factor": 2.5, "norm_topk_prob": True, "is_moe_layer": [False] + [True] * (layers - 1),
                "first_k_dense_replace": 1, "sliding_window": 4, "layer_types": kinds, "rope_scaling": None,
                "sliding_windows": [4 if kind == "sliding_attention" else 0 for kind in kinds],
                "mtp_layer_types": ["full_attention"], "dtype": "float32"}
    if family == "ernie4_5_moe":  # ERNIE-4.5-21B-A3B-PT's keys: a dense first layer, then MoE (softmax routing)
        return {**{k: v for k, v in common.items() if k not in MOE}, "architectures": ["Ernie4_5_MoeForCausalLM"],
                "model_type": "ernie4_5_moe", "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0, "use_rmsnorm": True, "use_bias": False, "moe_num_experts": 4,
                "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "moe_layer_interval": 1,
                "moe_intermediate_size": 32, "moe_k": 2, "moe_gate": "topk", "moe_use_aux_free": True}
    if family == "mimo_v2_flash":  # MiMo-V2-Flash's keys: global and sliding-window layers (with attention sinks)
        return {**{k: v for k, v in common.items() if k not in ("rms_norm_eps", "n_shared_experts")},
                "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
                "num_key_value_heads": 1, "head_dim": 24, "v_head_dim": 16, "swa_num_attention_heads": 4,
                "swa_num_key_value_heads": 2, "swa_head_dim": 24, "swa_v_head_dim": 16,
                "partial_rotary_factor": 0.334, "rope_theta": 5000000.0, "swa_rope_theta": 10000.0,
                "sliding_window": 4, "sliding_window_size": 4, "attention_chunk_size": 4,
                "hybrid_layer_pattern": [0] + [1] * (layers - 1), "moe_layer_freq": [0] + [1] * (layers - 1),
                "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
                "n_shared_experts": None, "routed_scaling_factor": None, "n_group": 1, "topk_group": 1,
                "layernorm_epsilon": 1e-6, "attention_value_scale": 0.707}
    if family == "step3p5":  # Step 3.5 Flash's keys (per-layer lists cover the MTP layer); zero-centred norms
        kinds = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers + 1)]
        return {**{k: v for k, v in common.items() if k not in MOE}, "architectures": ["Step3p5ForCausalLM"],
                "model_type": "step3p5", "num_attention_groups": 2, "head_dim": 16,
                "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 6,
                                            "num_attention_groups": 2, "head_dim": 16, "true_head_dim": 16},
                "layer_types": kinds, "sliding_window": 4, "use_head_wise_attn_gate": True, "use_qk_norm": True,
                "rope_theta": [5000000.0 if k == "full_attention" else 10000.0 for k in kinds],
                "partial_rotary_factors": [0.5 if k == "full_attention" else 1.0 for k in kinds],
                "rope_scaling": {"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 64,
                                 "low_freq_factor": 1.0, "high_freq_factor": 32.0},
                "yarn_only_types": ["full_attention"], "max_seq_len": 4096, "use_moe": True,
                "moe_layers_enum": ",".join(str(i) for i in range(1, layers)), "moe_num_experts": 4,
                "moe_top_k": 2, "moe_intermediate_size": 32, "share_expert_dim": 32,
                "moe_router_activation": "sigmoid", "moe_router_scaling_factor": 3.0, "norm_expert_weight": True,
                "use_moe_router_bias": True, "need_fp32_gate": True, "att_impl_type": "GQA",
                "moe_layer_offset": 0, "moe_every_n_layer": 1, "swiglu_limits": [0.0] * (layers - 1) + [7.0, 0.0],
                "swiglu_limits_shared": [0.0] * (layers - 1) + [16.0, 0.0], "zero_centered": True,
                "sink": False, "use_rope_layers": []}
    if family == "longcat_flash":  # LongCat-Flash's keys: `num_layers` of two MLA sublayers, MLPs and experts each
        return {**{k: v for k, v in common.items() if k not in (*MOE, "num_hidden_layers", "intermediate_size")},
                "architectures": ["LongcatFlashForCausalLM"], "model_type": "longcat_flash", "num_layers": layers,
                "ffn_hidden_size": 2 * hidden, "expert_ffn_hidden_size": 32, "n_routed_experts": 4,
                "zero_expert_num": 2, "zero_expert_type": "identity", "moe_topk": 2, "routed_scaling_factor": 6.0,
                "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 16, "v_head_dim": 16, "mla_scale_q_lora": True, "mla_scale_kv_lora": True,
                "attention_method": "MLA", "norm_topk_prob": False, "router_bias": False, "rope_scaling": None}
    if family == "bailing_hybrid":  # Ling / Ring 2.5's keys: a gated linear attention layer, then an MLA one, ...
        return {**{k: v for k, v in common.items() if k not in MOE}, "architectures": ["BailingMoeV2_5ForCausalLM"],
                "model_type": "bailing_hybrid", "num_hidden_layers": 4, "layer_group_size": 2, "group_norm_size": 4,
                "num_key_value_heads": 4, "head_dim": 16, "q_lora_rank": 48, "kv_lora_rank": 32,
                "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "partial_rotary_factor": 0.5,
                "rope_interleave": True, "rope_scaling": None, "use_qk_norm": True, "use_qkv_bias": False,
                "use_bias": False, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1,
                "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                "routed_scaling_factor": 2.5, "score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                "norm_topk_prob": True, "pad_token_id": 0}
    if family == "nemotron_h":  # Nemotron 3 Super's MTP keys: one layer of an attention and an expert sublayer
        return {**nemotron_h_config(vocab, hidden=hidden), "num_nextn_predict_layers": 1,
                "mtp_hybrid_override_pattern": "*E"}
    if family == "bailing_moe_v3":  # Ling 3.0's keys: Kimi's delta attention (KDA) layers, then an MLA one, ...;
        return {**config("bailing_hybrid", vocab, hidden, layers),  # declared bailing_hybrid, run by mlx-lm's
                "architectures": ["BailingMoeV3ForCausalLM"], "moe_shared_expert_intermediate_size": 32,  # V3
                "short_conv_kernel_size": 4, "kda_lower_bound": -5.0, "kda_safe_gate": True, "no_kda_lora": True}
    if family == "kimi_k3":  # Kimi K3's keys (moonshotai/Kimi-K3's text_config, scaled down), nested as published:
        text = {**{k: v for k, v in common.items() if k not in MOE}, "model_type": "kimi_linear",  # delta attention
                "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 2,  # (KDA)
                "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "hidden_act": "situ", "activation_situ_beta": 4.0,
                "activation_situ_linear_beta": 25.0, "attn_res_block_size": 2,  # layers, then an MLA one, attention
                "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 2,  # residuals
                                       "head_dim": 32, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                                       "use_full_rank_gate": True},
                "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                "v_head_dim": 16, "mla_use_nope": True, "mla_use_output_gate": True, "num_experts": 4,
                "num_experts_per_token": 2, "num_shared_experts": 2, "moe_intermediate_size": 32,
                "routed_expert_hidden_size": 32, "latent_moe_use_norm": True, "moe_renormalize": True,
                "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.5, "use_grouped_topk": True,
                "num_expert_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1}
        return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": text,
                "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": 0}
    return {**common, "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "num_key_value_heads": 2,
            "head_dim": 16, "partial_rotary_factor": 0.5, "use_qk_norm": True, "attention_bias": True,
            "rope_scaling": None, "n_group": 1}
