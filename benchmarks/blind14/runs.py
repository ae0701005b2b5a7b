"""The runs of the fourteenth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": olmo3 | bigcode | gemma3 | persimmon. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy
    "H1_olmo3_ademamix": dict(
        model="olmo3", twin=None, bug=None, expected=None,
        what="HF Olmo3ForCausalLM from a config (OLMo-3: RMSNorm on each sub-layer's output before the residual add, "
             "QK-norm, GQA 4/2, SwiGLU 352, untied head; layers sliding/sliding/full with a window of 4096), trained "
             "by AdEMAMix written by hand after apple/ml-ademamix (betas 0.9/0.999/0.9999, alpha 5, the alpha and "
             "beta3 schedulers over the whole run, no bias correction on the slow EMA, decoupled wd 0.1 on matrices), "
             "lr 3e-3, warm-up 10 then cosine to 10%, clip 1.0"),
    "H2_bigcode_fim": dict(
        model="bigcode", twin=None, bug=None, expected=None,
        what="HF GPTBigCodeForCausalLM from a config (SantaCoder / StarCoder-1: multi-query attention, learned "
             "absolute positions, LayerNorm, GELU MLP 512, head tied to the embedding), torch AdamW lr 3e-3 (0.9, "
             "0.95, wd 0.1 on matrices), warm-up 10 then a cosine to eta_min = 3e-4 (written with an absolute "
             "minimum), clip 1.0, trained with the fill-in-the-middle transformation (Bavarian et al. 2022): half of "
             "the windows cut at two random points and rearranged PSM or SPM (half each) with three sentinel bytes"),
    "H3_gemma3_reservoir": dict(
        model="gemma3", twin=None, bug=None, expected=None,
        what="HF Gemma3ForCausalLM from a Gemma3TextConfig (RMSNorm with a 1 + w gain, pre- and post-norms around "
             "each sub-layer, QK-norm, embeddings scaled by sqrt(d), GQA 4/2, GeGLU 352, tied head; layers "
             "sliding/sliding/full with a window of 4096), with a reservoir layer (Shen et al. 2021): every parameter "
             "frozen, then the embedding, layers 0 and 2 and the final norm switched back on; layer 1 stays at its "
             "random init. AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices) on the trainable parameters, warm-up 10 "
             "then cosine to 10%, clip 1.0"),
    "H4_persimmon_poly1": dict(
        model="persimmon", twin=None, bug=None, expected=None,
        what="HF PersimmonForCausalLM from a config (Adept Persimmon: LayerNorm, QK-LayerNorm, rotary on half of "
             "each head, squared-ReLU MLP 512 without gate, untied head), torch AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on "
             "matrices), transformers' get_cosine_schedule_with_warmup lambda (warm-up 10, num_cycles 0.5: to 0), "
             "clip 1.0; the loss is Poly-1 (Leng et al. 2022): cross-entropy + epsilon (1 - p_t), epsilon 1, p_t the "
             "softmax probability of the target"),
    "H5_gemma3_grokfast": dict(
        model="gemma3", twin=None, bug=None, expected=None,
        what="HF Gemma3ForCausalLM as H3 (no reservoir), torch AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), "
             "warm-up 10 then cosine to 10%, clip 1.0, with the Grokfast-EMA gradient filter (Lee et al. 2024; "
             "ironjr/grokfast's gradfilter_ema, alpha 0.98, lamb 2.0): each gradient gets 2 x the EMA of its past "
             "gradients added before clipping and the optimizer step"),
    # ---------------------------------------------------------------- failing
    "F01_olmo3_clip_max_norm_zero": dict(
        model="olmo3", twin="H1_olmo3_ademamix", bug="clip_max_norm_zero", expected="training_loop",
        what="H1 whose config says max_grad_norm 0.0 (meaning 'no clipping', as in DeepSpeed-style configs) and whose "
             "loop calls clip_grad_norm_(params, max_grad_norm) without a '> 0' guard: the clip coefficient is 0, "
             "every gradient is zeroed before the optimizer step (only the decoupled weight decay acts)"),
    "F02_olmo3_ademamix_slow_bias_corrected": dict(
        model="olmo3", twin="H1_olmo3_ademamix", bug="ademamix_slow_bias_corrected", expected="optimizer",
        what="H1 whose AdEMAMix divides the slow EMA by 1 - beta3^t (Adam's bias correction carried over to m2, "
             "which the algorithm leaves uncorrected): with beta3 scheduled towards 0.9999, 1 - beta3^t falls to "
             "~0.02, so alpha x m2 is inflated up to ~60x and dominates the update"),
    "F03_bigcode_fim_inputs_only": dict(
        model="bigcode", twin="H2_bigcode_fim", bug="fim_inputs_only", expected="data",
        what="H2 whose FIM transformation is applied to the inputs only: the labels are cut from the window as it "
             "was before the permutation, so in the half of the windows that are permuted nearly every target is "
             "not the byte that follows its input"),
    "F04_bigcode_eta_min_ratio": dict(
        model="bigcode", twin="H2_bigcode_fim", bug="eta_min_ratio", expected="learning_rate",
        what="H2 whose cosine is given eta_min = 0.1 (the ratio 'end at 10% of the peak') where the absolute minimum "
             "lr is read: the 'decay' goes from 3e-3 up to 0.1 (1.6e-2 at step 40, 5e-2 at step 80)"),
    "F05_gemma3_unfreeze_module_attribute": dict(
        model="gemma3", twin="H3_gemma3_reservoir", bug="unfreeze_module_attribute", expected="gradient_flow",
        what="H3 whose trained layers are switched back on with `layer.requires_grad = True` (a plain attribute on "
             "the nn.Module) instead of layer.requires_grad_(True): layers 0 and 2 stay frozen like the reservoir "
             "layer; only the embedding (and the tied head) and the final norm train"),
    "F06_gemma3_rmsnorm_offset_dropped": dict(
        model="gemma3", twin="H3_gemma3_reservoir", bug="rmsnorm_offset_dropped", expected="norm",
        what="H3 whose Gemma-3 RMSNorms are replaced by a fused Llama-style RMSNorm, x_hat * w, sharing their "
             "weights: Gemma stores the gain as an offset (x_hat * (1 + w), w initialised at 0), so every norm — the "
             "QK-norms and the final norm included — starts with gain 0 instead of 1"),
    "F07_persimmon_poly1_sigmoid_pt": dict(
        model="persimmon", twin="H4_persimmon_poly1", bug="poly1_sigmoid_pt", expected="loss_function",
        what="H4 whose Poly-1 term takes p_t = sigmoid(z_t) (the form of the paper's sigmoid-based Poly-1 focal "
             "loss) instead of the softmax probability of the target: epsilon (1 - sigmoid(z_t)) rewards a large "
             "target logit whatever the other logits do"),
    "F08_persimmon_cosine_num_cycles": dict(
        model="persimmon", twin="H4_persimmon_poly1", bug="cosine_num_cycles", expected="learning_rate",
        what="H4 whose get_cosine_schedule_with_warmup is given num_cycles=3 (the restart count of the hard-restarts "
             "variant; in the plain cosine it is the number of waves, default 0.5): the lr falls to 0 at 1/6, 1/2 "
             "and 5/6 of the decay, comes back to the peak in between, and ends at the peak"),
    "F09_gemma3_grokfast_args_swapped": dict(
        model="gemma3", twin="H5_gemma3_grokfast", bug="grokfast_args_swapped", expected="optimizer",
        what="H5 whose filter is called gradfilter_ema(model, grads, 2.0, 0.98): alpha and lamb passed positionally "
             "in each other's place, so the 'EMA' is 2 x EMA - g, which doubles every step, and the gradient the "
             "optimizer sees is dominated by it"),
    "F10_gemma3_bidirectional_flag": dict(
        model="gemma3", twin="H5_gemma3_grokfast", bug="bidirectional_flag", expected="mask",
        what="H5 whose Gemma3TextConfig has use_bidirectional_attention=True (EmbeddingGemma's setting, copied from "
             "an encoder config): the attention is not causal, every position sees its own next byte, in training "
             "and in the held-out pass"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
assert max(sum(r["twin"] == h for r in RUNS.values()) for h in RUNS) <= 2
