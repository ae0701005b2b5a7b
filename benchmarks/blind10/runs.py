"""The runs of the tenth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": qwen3 | stablelm | granite. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy: the plain twins
    "H1_qwen3_adamw_cosine": dict(
        model="qwen3", twin=None, bug=None, expected=None,
        what="HF Qwen3ForCausalLM from a config (GQA 4/2, head_dim 32, QK-norm, SwiGLU 352, tied head), AdamW lr 6e-3 "
             "(0.9, 0.95, wd 0.1 on matrices), LambdaLR: min(1, (step + 1) / 10) * cosine to 10% over the run, "
             "clip 1.0"),
    "H2_stablelm_adam_linear": dict(
        model="stablelm", twin=None, bug=None, expected=None,
        what="HF StableLmForCausalLM from a config (LayerNorm with bias, rotary on 25% of each head, qkv biases, "
             "SwiGLU 352, untied head), Adam lr 2e-3 (0.9, 0.98) under transformers' "
             "get_linear_schedule_with_warmup (10 steps, then linear to 0), clip 1.0, and a loss-spike guard "
             "(a step is skipped when its loss is above 2x the running mean of the past losses; never triggers)"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H3_qwen3_layerdrop": dict(
        model="qwen3", twin=None, bug=None, expected=None,
        what="H1 with LayerDrop (Fan, Grave & Joulin 2020; structured dropout of whole layers): in training each "
             "decoder layer is skipped with probability 0.2 at every forward (its output replaced by its input, "
             "so a skipped layer gets no gradient that step); all layers at evaluation. A gradient hook on the "
             "(tied) embedding keeps the row of byte 0, a reserved id that never occurs, at its initial value"),
    "H4_stablelm_adan": dict(
        model="stablelm", twin=None, bug=None, expected=None,
        what="H2's model trained by Adan (Xie et al. 2024, hand-written after sail-sg/Adan: Nesterov momentum "
             "estimated from gradient differences, betas (0.98, 0.92, 0.99), decoupled wd 0.02), lr 1e-2 "
             "(Adan's larger-than-Adam lr), 10-step warm-up then cosine to 10%, clip 1.0"),
    "H5_granite_mup": dict(
        model="granite", twin=None, bug=None, expected=None,
        what="HF GraniteForCausalLM from a config with Granite 3.0's muP multipliers (embedding x12, attention "
             "scale 1/head_dim, residual branches x0.22, logits / 8, tied head), AdamW with muP per-group lr (hidden "
             "matrices at 8e-3 / width_mult 4 = 2e-3, embedding and gains at 8e-3, linearly scaled from a reference "
             "batch of 2048 tokens: x1 here), 10-step warm-up then cosine to 10%, clip 1.0, and "
             "every 40 steps an export of the weights with the embedding multiplier folded into a copy of the embedding"),
    # ---------------------------------------------------------------- failing
    "F01_qwen3_backwards_windows": dict(
        model="qwen3", twin="H1_qwen3_adamw_cosine", bug="backwards_windows", expected="data",
        what="H1 whose loader is the backward language model's (fastai/ULMFiT backwards=True): every training "
             "window is byte-reversed, so the model learns to predict the previous byte; the held-out text is "
             "read forwards"),
    "F02_stablelm_adan_step_count_after": dict(
        model="stablelm", twin="H4_stablelm_adan", bug="adan_step_count_after", expected="optimizer",
        what="H4 whose Adan increments its step counter after computing the bias corrections instead of before: "
             "at the first step k = 0, 1 - beta^0 = 0, so m / 0 and sqrt(n) / 0 are inf and the update inf / inf "
             "is nan; every weight is nan after the first optimizer step"),
    "F03_stablelm_log_mean_prob": dict(
        model="stablelm", twin="H2_stablelm_adam_linear", bug="log_mean_prob", expected="loss_function",
        what="H2 whose hand-written loss is -log(mean over tokens of p(target)) instead of the mean over tokens "
             "of -log p(target): the log of the average likelihood, whose gradient weights each token by its own "
             "probability (the hard tokens get almost none)"),
    "F04_stablelm_spike_guard_best": dict(
        model="stablelm", twin="H2_stablelm_adam_linear", bug="spike_guard_best", expected="training_loop",
        what="H2 whose loss-spike guard compares each loss with the best loss so far (the checkpointing code's "
             "best_loss) instead of 2x the running mean: every step whose loss is not a new record is skipped "
             "(no optimizer step, no scheduler step)"),
    "F05_qwen3_embedding_mask_inverted": dict(
        model="qwen3", twin="H3_qwen3_layerdrop", bug="embedding_mask_inverted", expected="gradient_flow",
        what="H3 whose embedding gradient hook multiplies the gradient by (ids == 0) where (ids != 0) was meant: "
             "only the row of byte 0 (which never occurs) gets a gradient, so the whole token embedding, and the "
             "output head tied to it, stays at its initial values while the decoder layers train"),
    "F06_qwen3_layerdrop_survival_prob": dict(
        model="qwen3", twin="H3_qwen3_layerdrop", bug="layerdrop_survival_prob", expected="architecture",
        what="H3 whose LayerDrop rate is 0.8, stochastic depth's survival probability (Huang et al. 2016) given "
             "to the field that takes the drop probability: each layer is skipped at 80% of the training "
             "forwards, and all three run at evaluation"),
    "F07_stablelm_adan_stale_pre_grad": dict(
        model="stablelm", twin="H4_stablelm_adan", bug="adan_stale_pre_grad", expected="optimizer",
        what="H4 whose Adan never refreshes its previous-gradient buffer (the copy of g into pre_grad at the end "
             "of each step is missing): g - g_prev is measured against the first step's gradient for the whole "
             "run, so the Nesterov term b2 * EMA(g - g_1) carries -g_1 and every update keeps pushing along the "
             "first gradient's ascent direction"),
    "F08_qwen3_gpt2_name_groups": dict(
        model="qwen3", twin="H1_qwen3_adamw_cosine", bug="gpt2_name_groups", expected="optimizer",
        what="H2 whose loss is a hand-written log-softmax, z - log(sum(exp(z))), computed in float16 ('to halve "
             "the memory of the logits') without subtracting the row maximum: exp(z) overflows float16 once a "
             "logit passes ~11.1"),
    "F09_granite_export_fold_alias": dict(
        model="granite", twin="H5_granite_mup", bug="export_fold_alias", expected="weights",
        what="H5 whose export folds the embedding multiplier into model.state_dict()['model.embed_tokens.weight'] "
             "in place; the state dict holds the live parameters, so at every export (steps 40, 80, 120) the tied "
             "embedding is multiplied by 12 while the model still multiplies its input by 12"),
    "F10_granite_lr_scale_sequences": dict(
        model="granite", twin="H5_granite_mup", bug="lr_scale_sequences", expected="learning_rate",
        what="H5 whose linear scaling rule counts the batch in sequences (16) where the reference batch is in "
             "tokens (2048): every group's lr is 128x too small (1.6e-5 for the hidden matrices, 6.3e-5 for the "
             "embedding and gains)"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
assert max(sum(r["twin"] == h for r in RUNS.values()) for h in RUNS) <= 3
