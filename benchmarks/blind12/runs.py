"""The runs of the twelfth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": helium | glm4 | nemotron | ernie45 | arcee. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy
    "H1_helium_adamw_wsd": dict(
        model="helium", twin=None, bug=None, expected=None,
        what="HF HeliumForCausalLM from a config (GQA 4/2, head_dim 32, SwiGLU 352, RMSNorm, untied head), torch "
             "AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), clip 1.0, under a warmup-stable-decay (WSD) schedule "
             "written as LambdaLR(min(1, (step + 1) / 5) * min(1, (160 - step) / 32)): 5-step linear warm-up, "
             "constant peak until step 128, then a linear cool-down to 0 at step 160 (the last 20% of the run)"),
    "H2_glm4_nadam_bf16_shuffle_pool": dict(
        model="glm4", twin=None, bug=None, expected=None,
        what="HF Glm4ForCausalLM from a config (GQA 4/2, head_dim 32, partial rotary 0.5, post-sublayer norms, "
             "untied head) under CPU bf16 autocast, torch NAdam with decoupled weight decay (lr 3e-3, 0.9/0.95, "
             "wd 0.1 on matrices, momentum_decay 4e-3), warm-up 10 then cosine to 10%, clip 1.0; the data a pool of "
             "non-overlapping 129-byte chunks (HF group_texts style) held as one 2-D numpy array, shuffled in place "
             "with numpy's Generator.shuffle before every batch, the batch its first 16 rows (shuffle-and-take); "
             "the loss a hand-written NLL, -log_softmax(z).gather(y).mean()"),
    "H3_nemotron_adopt_custom_attention": dict(
        model="nemotron", twin=None, bug=None, expected=None,
        what="HF NemotronForCausalLM from a config (GQA 4/2, head_dim 32, partial rotary 0.5, LayerNorm1P, "
             "squared-ReLU MLP, untied head) whose attention is a function registered with transformers' "
             "AttentionInterface (repeat the KV heads, F.scaled_dot_product_attention(is_causal=True) on "
             "(B, H, T, D), back to (B, T, H, D)), trained by ADOPT written by hand after iShohei220/adopt "
             "(betas 0.9/0.9999, eps 1e-6, the first step only initialises v = g^2, then m = lerp(m, "
             "clamp(g / max(sqrt(v), eps), +-t^0.25)), p -= lr m, v = b2 v + (1 - b2) g^2; decoupled wd 0.1 on "
             "matrices), lr 3e-3, warm-up 10 then cosine to 10%, clip 1.0"),
    "H4_ernie45_sgd_agc": dict(
        model="ernie45", twin=None, bug=None, expected=None,
        what="HF Ernie4_5ForCausalLM from a config (GQA 4/2, head_dim 32, SwiGLU 352, RMSNorm, head tied to the "
             "embedding), SGD with Nesterov momentum 0.9 written by hand with torch.optim.SGD's rule, lr 0.1, "
             "warm-up 10 then cosine to 10%, and NFNets' adaptive gradient clipping instead of a global clip "
             "(timm's adaptive_clip_grad: each unit's gradient norm clipped to 1% of its weight norm, eps 1e-3)"),
    "H5_arcee_zloss_ema": dict(
        model="arcee", twin=None, bug=None, expected=None,
        what="HF ArceeForCausalLM from a config (GQA 4/2, head_dim 32, squared-ReLU MLP 352 without gate, "
             "RMSNorm, untied head), torch AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine "
             "to 10%, clip 1.0; the loss cross-entropy + PaLM's z-loss 1e-4 * logsumexp(z)^2; an EMA of the "
             "weights kept in the manner of diffusers' EMAModel (fixed decay 0.99: decay=0.99, min_decay=0.99), "
             "evaluated every 10 steps by store() / copy_to() / held-out pass / restore() on the training model"),
    # ---------------------------------------------------------------- failing
    "F01_helium_ce_view_class_dim": dict(
        model="helium", twin="H1_helium_adamw_wsd", bug="ce_view_class_dim", expected="loss_function",
        what="H1 whose loss puts the vocabulary in the class dimension cross_entropy expects for sequences, "
             "(B, V, T), with logits.view(B, V, T) instead of logits.transpose(1, 2): the memory of the (B, T, V) "
             "logits is re-read as (B, V, T), so each 'class score' of a position is some other position's logit "
             "for some other byte"),
    "F02_helium_wsd_warmup_max": dict(
        model="helium", twin="H1_helium_adamw_wsd", bug="wsd_warmup_max", expected="learning_rate",
        what="H1 whose scheduler.step() sits inside the 'if step % 10 == 0' evaluation block (an indentation "
             "slip): the per-step WSD schedule advances once every 10 steps, so the 10-step warm-up takes 100 "
             "steps (lr 3e-4 for steps 0-9, 6e-4 for 10-19, ...) and the cool-down never starts"),
    "F03_glm4_stdlib_random_shuffle": dict(
        model="glm4", twin="H2_glm4_nadam_bf16_shuffle_pool", bug="stdlib_random_shuffle", expected="data",
        what="H2 whose chunk array is shuffled with Python's random.shuffle (random.Random(seed).shuffle(chunks)) "
             "instead of numpy's: its swap x[i], x[j] = x[j], x[i] copies row j over row i through a view and "
             "leaves row j, so after a shuffle row i holds a copy of a row drawn from rows 0 ... i; the first 16 "
             "rows (the batch) therefore always descend from the pool's first 16 chunks (the first 2 KB of the "
             "stream, the opening of __future__.py; 9 distinct chunks over the run), and the repeated shuffles "
             "fill the pool with copies of its first rows (one chunk everywhere by step 160)"),
    "F04_glm4_nll_sign_dropped": dict(
        model="glm4", twin="H2_glm4_nadam_bf16_shuffle_pool", bug="nll_sign_dropped", expected="loss_function",
        what="H2 whose hand-written loss is the mean log-likelihood of the targets, "
             "log_softmax(z).gather(y).mean(), without the minus of the negative log-likelihood: the optimizer "
             "minimises the targets' log-probability"),
    "F05_nemotron_adopt_betas_swapped": dict(
        model="nemotron", twin="H3_nemotron_adopt_custom_attention", bug="adopt_betas_swapped",
        expected="optimizer",
        what="H3 whose ADOPT is given its betas in the other order, betas=(0.9999, 0.9): the first moment "
             "m = lerp(m, normalised g, 1e-4) stays at the first normalised gradient (m = it at the first update), "
             "so each weight moves by lr times its first update's direction at every step, and v follows g^2 "
             "over ~10 steps"),
    "F06_nemotron_adopt_clamp_min_only": dict(
        model="nemotron", twin="H3_nemotron_adopt_custom_attention", bug="adopt_clamp_min_only",
        expected="optimizer",
        what="H3 whose ADOPT clips the normalised gradient with normed.clamp_(t ** 0.25), meaning the symmetric "
             "clip +-t^0.25: torch.clamp's single positional bound is the minimum, so every element of the "
             "normalised gradient becomes at least t^0.25 (>= 1), the momentum is positive everywhere and every "
             "weight is pushed down by at least lr at every step"),
    "F07_ernie45_agc_where_swapped": dict(
        model="ernie45", twin="H4_ernie45_sgd_agc", bug="agc_where_swapped", expected="training_loop",
        what="H4 whose adaptive gradient clipping has the two branches of torch.where swapped, "
             "torch.where(grad_norm < max_norm, clipped_grad, grad): every unit whose gradient is below 1% of its "
             "weight norm is scaled up to exactly that norm, and every unit above it is left unclipped"),
    "F08_ernie45_nesterov_sign": dict(
        model="ernie45", twin="H4_ernie45_sgd_agc", bug="nesterov_sign", expected="optimizer",
        what="H4 whose Nesterov step adds the momentum term with the wrong sign, p = p - lr g + lr mu buf "
             "(PaddlePaddle's pre-#12231 momentum op) instead of p = p - lr (g + mu buf): once the buffer has "
             "built up (buf ~ 10 g) every step moves uphill"),
    "F09_arcee_ce_on_detached_logits": dict(
        model="arcee", twin="H5_arcee_zloss_ema", bug="ce_on_detached_logits", expected="gradient_flow",
        what="H5 whose cross-entropy is computed on logits.detach() (the tensor kept for the metrics) and the "
             "z-loss on the live logits: the loss value is the same, no error is raised (the z-loss keeps the graph "
             "alive), but the only gradient is the z-loss's"),
    "F10_arcee_ema_not_restored": dict(
        model="arcee", twin="H5_arcee_zloss_ema", bug="ema_not_restored", expected="training_loop",
        what="H5 whose EMA evaluation calls ema.store() and ema.copy_to() but not ema.restore(): after every "
             "evaluation (every 10 steps) training goes on from the EMA weights, which lag the trained ones, with "
             "the optimizer's state kept"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
assert max(sum(r["twin"] == h for r in RUNS.values()) for h in RUNS) <= 2
