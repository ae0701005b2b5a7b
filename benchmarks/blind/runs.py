"""The runs of the blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": nano | gpt2 | llama. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy
    "H1_nano_base": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="nanoGPT-style (hand-written attention), AdamW(0.9, 0.95, wd 0.1), warm-up 10 steps "
             "then cosine to 10%, clip 1.0, tied embedding"),
    "H2_gpt2_base": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="HF GPT2LMHeadModel (sdpa), Adam lr 1e-3 constant"),
    "H3_llama_base": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="HF LlamaForCausalLM (sdpa, GQA, untied head), Adam lr 2e-3, linear decay to 0"),
    "H4_nano_accum_smooth_dropout": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with gradient accumulation (2 micro-batches, loss/2), label smoothing 0.1, "
             "dropout 0.1"),
    "H5_nano_frozen_emb_ckpt": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="nanoGPT-style with untied head, token+position embeddings frozen on purpose (fixed "
             "random features) and activation checkpointing of every block (use_reentrant=False); "
             "otherwise H1 (AdamW, warm-up + cosine, clip 1.0)"),
    "H6_llama_small_bf16_adagrad": dict(
        model="llama_small", twin=None, bug=None, expected=None,
        what="a smaller HF LlamaForCausalLM (d 64, 2 layers, tied) under bf16 autocast, batch 8, "
             "Adagrad lr 0.02, clip 1.0"),
    # ---------------------------------------------------------------- failing
    "F01_gpt2_lr_too_high": dict(
        model="gpt2", twin="H2_gpt2_base", bug="lr_too_high", expected="learning_rate",
        what="H2 with Adam lr 3e-2 instead of 1e-3"),
    "F02_llama_no_zero_grad": dict(
        model="llama", twin="H3_llama_base", bug="no_zero_grad", expected="training_loop",
        what="H3 without optimizer.zero_grad(): gradients accumulate over all steps"),
    "F03_nano_softmax_into_ce": dict(
        model="nano", twin="H1_nano_base", bug="softmax_into_ce", expected="loss_function",
        what="H1 with F.cross_entropy fed softmax probabilities instead of logits"),
    "F04_gpt2_same_batch": dict(
        model="gpt2", twin="H2_gpt2_base", bug="same_batch", expected="data",
        what="H2 with `next(iter(loader))` in the loop: the loader restarts, every step sees the "
             "first batch"),
    "F05_nano_mask_not_assigned": dict(
        model="nano", twin="H1_nano_base", bug="mask_not_assigned", expected="mask",
        what="H1 with `att.masked_fill(...)` whose result is discarded: no causal mask"),
    "F06_gpt2_fp16_adam": dict(
        model="gpt2", twin="H2_gpt2_base", bug="pure_fp16", expected="precision",
        what="H2 with model.half(): weights, grads and Adam state in fp16 (eps 1e-8 underflows)"),
    "F07_llama_init_std1": dict(
        model="llama", twin="H3_llama_base", bug="init_std1", expected="initialisation",
        what="H3 with initializer_range=1.0 instead of 0.02"),
    "F08_nano_warmup_in_tokens": dict(
        model="nano", twin="H1_nano_base", bug="warmup_tokens", expected="warmup",
        what="H1 with the warm-up length given in tokens to a per-step schedule (20480 steps "
             "instead of 10)"),
    "F09_nano_no_residual": dict(
        model="nano", twin="H1_nano_base", bug="no_residual", expected="residual",
        what="H1 with `x = f(ln(x))` instead of `x = x + f(ln(x))` in every block"),
    "F10_nano_layernorm_eps1": dict(
        model="nano", twin="H1_nano_base", bug="layernorm_eps1", expected="norm",
        what="H1 with nn.LayerNorm(d, bias): the positional bias flag True becomes eps = 1.0"),
    "F11_llama_adam_eps1": dict(
        model="llama", twin="H3_llama_base", bug="adam_eps1", expected="optimizer",
        what="H3 with Adam eps=1.0 (a value copied from the TF Inception advice) instead of 1e-8"),
    "F12_nano_reentrant_ckpt": dict(
        model="nano", twin="H5_nano_frozen_emb_ckpt", bug="reentrant_ckpt",
        expected="gradient_flow",
        what="H5 with use_reentrant=True checkpointing: the frozen embedding's output has no "
             "requires_grad, so no block gets a gradient"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
