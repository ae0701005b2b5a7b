"""The runs of the fourth blind benchmark: pure data (no torch), shared by train.py and report.py.

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
    # ---------------------------------------------------------------- healthy: the twins
    "H1_nano_base": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="nanoGPT-style (hand-written attention), AdamW(0.9, 0.95, wd 0.1 on matrices), warm-up 10 "
             "steps then cosine to 10%, clip 1.0, tied embedding"),
    "H2_gpt2_sgd": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="HF GPT2LMHeadModel (sdpa), SGD with Nesterov momentum 0.9, lr 0.3, warm-up 10 steps then "
             "cosine to 10%, clip 1.0"),
    "H3_llama_base": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="HF LlamaForCausalLM (sdpa, GQA, untied head), Adam lr 2e-3, linear decay to 0"),
    # ---------------------------------------------------------------- healthy: new, unusual but legitimate
    "H4_llama_adafactor": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="H3 under a hand-written Adafactor (factored second moments for matrices, beta2_t = 1 - t^-0.8, "
             "no momentum, update clipping d = 1, eps 1e-30), lr 3e-3 with linear decay to 0"),
    "H5_nano_schedulefree": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 under a hand-written Schedule-Free AdamW (Defazio et al. 2024): no lr schedule after a "
             "10-step warm-up, gradients at y, evaluation at the averaged x (optimizer.eval()/train() "
             "around the held-out loss)"),
    # ---------------------------------------------------------------- failing
    "F01_llama_whitespace_normalised_train": dict(
        model="llama", twin="H3_llama_base", bug="whitespace_normalised_train", expected="data",
        what="H3 whose training text goes through a cleaning step that collapses every run of whitespace "
             "(newlines, indentation) into one space (' '.join(text.split())); the held-out text is fed as it is"),
    "F02_nano_log_softmax_batch_dim": dict(
        model="nano", twin="H1_nano_base", bug="log_softmax_batch_dim", expected="loss_function",
        what="H1 whose loss is nll_loss(log_softmax(logits, dim=0)): the (B, T, V) logits normalised over "
             "the batch, not over the vocabulary"),
    "F03_nano_wpe_default_init": dict(
        model="nano", twin="H1_nano_base", bug="wpe_default_init", expected="initialisation",
        what="H1 whose _init_weights has an nn.Linear branch only (the token embedding is covered through the "
             "tied head): the position embedding keeps nn.Embedding's default N(0, 1), 50x the token embedding"),
    "F04_llama_adam_bias_correction_multiplied": dict(
        model="llama", twin="H3_llama_base", bug="adam_bias_correction_multiplied", expected="optimizer",
        what="H3 under a hand-written Adam whose bias correction multiplies by (1 - beta^t) instead of "
             "dividing: m_hat = m (1 - b1^t), v_hat = v (1 - b2^t)"),
    "F05_gpt2_loss_rewrapped": dict(
        model="gpt2", twin="H2_gpt2_sgd", bug="loss_rewrapped", expected="gradient_flow",
        what="H2 whose loss is rebuilt as torch.tensor(loss.item(), requires_grad=True) (to silence "
             "'element 0 of tensors does not require grad'): backward reaches no parameter"),
    "F06_nano_ln2_mapped_to_ln1": dict(
        model="nano", twin="H1_nano_base", bug="ln2_mapped_to_ln1", expected="weights",
        what="H1 resumed after step 80 from a converted checkpoint whose name mapping sends every block's ln_2 "
             "onto ln_1: ln_1 gets ln_2's trained values, ln_2's weight and bias keep the zeros of the "
             "converter's freshly allocated target (strict loading passes, the optimizer state is kept)"),
    "F07_gpt2_clip_after_step": dict(
        model="gpt2", twin="H2_gpt2_sgd", bug="clip_after_step", expected="training_loop",
        what="H2 with clip_grad_norm_ moved after optimizer.step(): the clipping never touches the gradient "
             "the step uses"),
    "F08_llama_lambdalr_returns_lr": dict(
        model="llama", twin="H4_llama_adafactor", bug="lambdalr_returns_lr", expected="learning_rate",
        what="H4 whose LambdaLR lambda returns the learning rate (3e-3 * decay) instead of the factor: "
             "lr = 3e-3 * 3e-3 * decay, at most 9e-6"),
    "F09_llama_rmsnorm_divides_by_rsqrt": dict(
        model="llama", twin="H3_llama_base", bug="rmsnorm_divides_by_rsqrt", expected="norm",
        what="H3 with every RMSNorm (the final one included) written x / rsqrt(mean(x^2) + eps) * w: "
             "multiplied by the rms instead of divided"),
    "F10_nano_mask_ones_times_inf": dict(
        model="nano", twin="H5_nano_schedulefree", bug="mask_ones_times_inf", expected="mask",
        what="H5 whose additive causal mask is torch.triu(torch.ones(T, T), 1) * float('-inf'): 0 * -inf = nan "
             "on and below the diagonal, so every attention score is nan"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
