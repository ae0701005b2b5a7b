"""The runs of the second blind benchmark: pure data (no torch), shared by train.py and report.py.

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
    "H2_gpt2_base": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="HF GPT2LMHeadModel (sdpa), Adam lr 1e-3 constant; tokens through a uint16 token file"),
    "H3_llama_base": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="HF LlamaForCausalLM (sdpa, GQA, untied head), Adam lr 2e-3, linear decay to 0"),
    # ---------------------------------------------------------------- healthy: new, unusual but legitimate
    "H4_nano_rmsnorm_zloss": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with x-transformers-style RMSNorm (F.normalize * sqrt(d) * g) in place of LayerNorm and "
             "PaLM's z-loss (1e-4 * logsumexp^2) added to the loss"),
    "H5_nano_packed_docmask": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 on packed documents: def/class chunks shuffled, joined with EOS, rows of 129; "
             "block-diagonal causal mask per document, positions restarting per document, no label on "
             "each document's first prediction"),
    "H6_llama_lion_ema": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="H3 with a hand-written Lion optimizer (lr 5e-4, betas 0.9/0.99, wd 0.3) and an EMA of the "
             "weights (0.95) swapped in for the held-out loss"),
    "H7_gpt2_mup_chunked_clipvalue": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="H2 with muP-style per-layer lr (hidden matrices 2e-3 * 32/128, the rest 2e-3), the loss in "
             "chunks of 32 positions (a backward per chunk into a detached hidden state, then one through "
             "the trunk), gradients clipped by value at 0.05"),
    # ---------------------------------------------------------------- failing
    "F01_gpt2_uint16_read_as_uint8": dict(
        model="gpt2", twin="H2_gpt2_base", bug="uint16_read_as_uint8", expected="data",
        what="H2 with the uint16 token file read back as uint8: a 0 after every byte"),
    "F02_llama_nll_on_logits": dict(
        model="llama", twin="H3_llama_base", bug="nll_on_logits", expected="loss_function",
        what="H3 with F.nll_loss on raw logits (no log_softmax): the loss is -logit[target], unbounded below"),
    "F03_nano_adam_l2_decay": dict(
        model="nano", twin="H1_nano_base", bug="adam_l2_decay", expected="optimizer",
        what="H1 with torch.optim.Adam instead of AdamW, same groups: weight_decay 0.1 becomes an L2 term "
             "in the gradient, normalised by Adam"),
    "F04_llama_step_outside_batch_loop": dict(
        model="llama", twin="H3_llama_base", bug="step_outside_batch_loop", expected="training_loop",
        what="H3 with `optimizer.step()` dedented out of the batch loop (epochs of 16 batches): one update "
             "per epoch, from the last batch's gradient; zero_grad, backward and the scheduler stay per batch"),
    "F05_llama_init_norm_weights": dict(
        model="llama", twin="H3_llama_base", bug="init_norm_weights", expected="initialisation",
        what="H3 with a custom init whose norm branch draws the RMSNorm gains from N(0, 0.02) instead of 1"),
    "F06_nano_attn_scale_multiplied": dict(
        model="nano", twin="H1_nano_base", bug="attn_scale_multiplied", expected="architecture",
        what="H1 with attention scores divided by scale = hs**-0.5, i.e. multiplied by sqrt(hs)"),
    "F07_nano_nograd_mlp_hidden": dict(
        model="nano", twin="H1_nano_base", bug="nograd_mlp_hidden", expected="gradient_flow",
        what="H1 with the MLP's hidden-activation helper (gelu(c_fc(x))) under @torch.no_grad(): c_fc gets "
             "no gradient and none flows back through any MLP branch"),
    "F08_nano_rmsnorm_no_sqrt_d": dict(
        model="nano", twin="H4_nano_rmsnorm_zloss", bug="rmsnorm_no_sqrt_d", expected="norm",
        what="H4 with the RMSNorm's sqrt(d) factor forgotten: every norm outputs rms 1/sqrt(128)"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
