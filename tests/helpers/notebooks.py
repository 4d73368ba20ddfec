"""The notebooks' smoke parameters and what their executed cells show."""


SMOKE = {
    "00_task_and_policy": ({"num_problems": 12},
                           ["accuracy", "length_p50", "length_p99", "eos_rate_tail"]),
    "01_long_tail_rollout": ({"num_prompts": 6, "samples_per_prompt": 2, "workers": 2},
                             ["num_requests", "workers", "makespan_s", "idle_fraction",
                              "tail_share", "length_p50", "length_p90", "length_p99",
                              "tokens_per_s", "accuracy"]),
    "02_speculative_decoding": ({"num_prompts": 1, "samples_per_prompt": 2,
                                 "batch_sizes": [1, 2], "ks": [2], "curve_k": 2,
                                 "temperatures": [0.0, 1.0], "repeats": 3,
                                 "max_new_tokens": 16, "lossless_prompts": 2,
                                 "whatif_samples": 8},
                                ["accept_len_eagle", "accept_len_ngram", "accept_len_small_lm",
                                 "accept_len_sibling", "accept_len_suffix",
                                 "speedup_bs1_sibling", "speedup_bs1_t1_suffix",
                                 "speedup_bs1", "speedup_bs8", "speedup_bs32", "speedup_bs1_t1",
                                 "speedup_bs1_min", "speedup_bs1_max", "speedup_bs1_t1_min",
                                 "speedup_bs1_t1_max", "speedup_spread_wide", "bound_bs1",
                                 "lossless", "compile"]),
    "03_adaptive_drafter": ({"rl_problems": 32, "prompts_per_step": 2, "samples_per_prompt": 2,
                             "max_new_tokens": 24, "steps": 2, "workers": 2, "probe_prompts": 3,
                             "tree_budget": 8, "tree_k": 3},
                            ["accept_len_static_first", "accept_len_static_final",
                             "accept_len_adaptive_first", "accept_len_adaptive_final",
                             "accept_len_tree", "accept_len_chain", "accept_len_export_final",
                             "accept_len_export_pre_rl", "kl_final"]),
    "04_tlt_rl": ({"rl_problems": 32, "eval_problems": 4, "prompts_per_step": 2,
                   "samples_per_prompt": 2, "max_new_tokens": 24, "steps": 2, "seeds": [0, 1],
                   "workers": 2, "explore_budget": 0.5, "divergence_steps": 1},
                  ["e2e_speedup_tlt", "amdahl_prediction_tlt", "rollout_speedup_tlt",
                   "drafter_overrun_s_max", "explore_cost_tlt", "plain_share_tlt",
                   "rollout_fraction_baseline", "accuracy_start", "accuracy_final_baseline",
                   "reward_final_baseline", "reward_final_tlt", "reward_final_sd_baseline",
                   "idle_fraction_baseline", "idle_fraction_tlt", "rl_steps",
                   "first_divergence_step", "predicted_e2e_speedup_tlt",
                   "simulator_error_tlt"]),
    "05_pruning": ({"calibration_size": 16, "train_size": 112, "eval_size": 8, "max_len": 64,
                    "distill_steps": 2, "search_candidates": 8, "search_top": 1,
                    "search_steps": 1, "depth_texts": 8, "max_batch": 2, "decode_tokens": 4,
                    "fast_max_flops": 0.7,
                    "batch_size": 4, "seeds": [0, 1]},
                   ["params_teacher", "params_width", "params_depth", "loss_after_prune_l2mean",
                    "loss_after_prune_random", "loss_after_prune_magnitude",
                    "loss_width_distilled", "loss_depth_distilled", "saturation_batch",
                    "teacher_tok_s", "throughput_ratio_width", "throughput_ratio_depth",
                    "loss_width_distilled_sd", "loss_depth_distilled_sd",
                    "width_depth_differ_significant"]),
    "06_distillation": ({"calibration_size": 8, "train_size": 128, "eval_size": 4, "max_len": 48,
                         "steps": 2, "eval_every": 1, "batch_size": 4, "eval_problems": 3,
                         "max_new_tokens": 16, "seeds": [0, 1]},
                        ["params_teacher", "params_student", "accuracy_teacher",
                         "accuracy_student_kd", "accuracy_student_ce", "accuracy_scratch",
                         "token_savings_vs_scratch", "accuracy_student_kd_hidden",
                         "accuracy_student_kd_sd", "accuracy_student_ce_sd", "accuracy_scratch_sd",
                         "accuracy_student_kd_hidden_sd", "eval_problems",
                         "kd_beats_ce_significant"]),
    "07_minitron_pipeline": ({"calibration_size": 8, "train_size": 128, "eval_size": 4,
                              "max_len": 48, "steps": 2, "batch_size": 4, "eval_problems": 3,
                              "max_new_tokens": 16, "max_batch": 2, "decode_tokens": 4,
                              "drafter_prompts": 2, "seeds": [0, 1]},
                             ["params_teacher", "params_student", "accuracy_teacher",
                              "accept_len_compressed_drafter", "speedup_compressed_drafter",
                              "saturation_batch", "lossless", "eval_problems",
                              "speedup_best_compressed_drafter", "best_compressed_drafter",
                              "speedup_drafter_depth_50pct"]),
    "08_ray_scaling": ({"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 16,
                        "steps": 1, "workers": 1, "idle_workers": 2, "idle_steps": 1},
                       ["ray_makespan_s", "sim_makespan_s", "sim_error", "ray_overhead_s_per_step",
                        "drafter_steps_all_idle", "drafter_steps_first_finisher",
                        "tokens_equal"]),
    "09_drafter_staleness": ({"rl_problems": 32, "eval_problems": 4, "prompts_per_step": 2,
                              "samples_per_prompt": 2, "max_new_tokens": 16, "workers": 2,
                              "steps": 2, "eval_every": 1, "measure_groups": 1,
                              "ceiling_max_steps": 4, "ceiling_check_every": 2,
                              "probe_prompts": 2, "checkpoint_every": 1},
                             ["tau_frozen_first", "tau_frozen_final", "tau_adaptive_final",
                              "tau_ceiling_final", "tau_sibling_final", "tau_suffix_final",
                              "tau_suffix_minus_sibling", "kl_final",
                              "byproduct_gain", "sibling_speedup_bs1", "sibling_speedup_bs32",
                              "accuracy_start", "accuracy_final"]),
    "10_cluster_what_if": ({"num_prompts": 16, "samples_per_prompt": 2, "max_new_tokens": 24,
                            "drafter": "ngram", "calibration_workers": 2,
                            "calibration_per_worker": [4], "held_out": [["seed", 2, 4, 1],
                                                                        ["N4", 4, 2, 2]],
                            "ray": False, "workers_sweep": [8, 64], "per_worker": 8,
                            "draws": 1, "threshold": 4, "repeats": 1},
                           ["predicted_speedup_64", "predicted_idle_fraction_64",
                            "sim_error_small_n", "sim_error_wall", "sim_seconds_1024",
                            "busy_error_small_n", "worker_spread", "ks_lognormal",
                            "ks_pareto", "predicted_speedup_tlt+seer_divided_64",
                            "predicted_speedup_seer_divided_64"]),
    "11_long_tail_remedies": ({"rl_problems": 32, "eval_problems": 4, "prompts_per_step": 2,
                               "samples_per_prompt": 2, "max_new_tokens": 24, "steps": 2,
                               "seeds": [0], "workers": 2, "explore_budget": 0.5,
                               "variants": ["baseline", "tlt", "tlt_suffix", "april",
                                            "tlt+async", "seer_divided"]},
                              ["speedup_tlt", "speedup_tlt_suffix", "speedup_april",
                               "speedup_tlt+async",
                               "seer_sim_error_seer_divided", "seer_whatif_speedup_both_n64",
                               "seer_whatif_speedup_both_n1024",
                               "offpolicy_share_april", "offpolicy_share_tlt+async",
                               "accuracy_final_baseline", "accuracy_final_april",
                               "accuracy_final_tlt+async", "best_time_to_accuracy",
                               "best_time_to_accuracy_s"]),
    "12_diagnose": ({"logs": "tests/fixtures/diagnose/verl_issue6",
                     "sd_curve": "tests/fixtures/diagnose/verl_issue6/sd_curve.csv"},
                    ["bottleneck", "rollout_share", "reward_share", "idle_fraction",
                     "tail_share", "predicted_tlt_threshold", "predicted_tlt_bandit"]),
}


def last_cell_images(executed) -> int:
    """PNG outputs of the executed notebook's last code cell."""
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    return sum("image/png" in o.get("data", {}) for o in last.outputs)


def printed(executed) -> str:
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.output_type == "stream")


def assert_reads_well(executed) -> None:
    """Saved progress bars show their final state (none frozen at 0%), no loading noise."""
    texts = display_texts(executed)
    frozen = [t for t in texts if " 0%|" in t]
    assert not frozen, frozen
    assert not [t for t in texts if "Loading weights" in t]
    assert printed(executed).count("Loading weights") == 0


def display_texts(executed) -> list[str]:
    """The text/plain of every display output saved in an executed notebook."""
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    return [o.get("data", {}).get("text/plain", "") for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "display_data"]
