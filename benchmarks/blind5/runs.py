"""The runs of the fifth blind benchmark: pure data (no torch), shared by train.py and report.py.

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
    # ---------------------------------------------------------------- healthy: the plain twins
    "H1_nano_base": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="nanoGPT-style (hand-written attention), AdamW(0.9, 0.95, wd 0.1 on matrices), warm-up 10 "
             "steps then cosine to 10%, clip 1.0, tied embedding"),
    "H2_gpt2_plateau": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="HF GPT2LMHeadModel (sdpa), Adam lr 1e-3, ReduceLROnPlateau(mode='min', factor 0.1, patience 2) "
             "on the held-out loss every 10 steps, clip 1.0"),
    "H3_llama_base": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="HF LlamaForCausalLM (sdpa, GQA, untied head), Adam lr 2e-3, linear decay to 0"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H4_nano_label_smoothing": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 trained against label-smoothed targets, q = 0.9 onehot + 0.1/256 (written by hand); the "
             "held-out loss is the plain cross-entropy"),
    "H5_gpt2_grad_accum": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="HF GPT-2, AdamW lr 2e-3 (0.9, 0.95, wd 0.1), warm-up 10 then cosine, clip 1.0; each batch of 16 "
             "as 8 micro-batches of 2 (loss / 8, zero_grad before the first, one optimizer step after the last)"),
    # ---------------------------------------------------------------- failing
    "F01_nano_block_returns_skip": dict(
        model="nano", twin="H1_nano_base", bug="block_returns_skip", expected="residual",
        what="H1 whose blocks end `out = x + mlp(ln_2(x)); return self.drop(x)` instead of self.drop(out): "
             "the MLP branch never reaches the residual stream"),
    "F02_nano_warmup_inverted": dict(
        model="nano", twin="H1_nano_base", bug="warmup_inverted", expected="warmup",
        what="H1 whose warm-up factor is written warmup / (step + 1) instead of (step + 1) / warmup: the lr "
             "starts at 10x the peak and falls to it over the 10 warm-up steps"),
    "F03_llama_adam_state_fp16_resume": dict(
        model="llama", twin="H3_llama_base", bug="adam_state_fp16_resume", expected="precision",
        what="H3 run as a chain of 20-step jobs, each resumed from the previous job's checkpoint, whose "
             "optimizer state is stored in float16: exp_avg_sq entries below float16's range come back as 0"),
    "F04_nano_head_reads_embeddings": dict(
        model="nano", twin="H1_nano_base", bug="head_reads_embeddings", expected="architecture",
        what="H1 whose forward runs the blocks on h = x but returns lm_head(ln_f(x)): the head reads the "
             "embeddings, the blocks' output is computed and dropped"),
    "F05_gpt2_plateau_mode_max": dict(
        model="gpt2", twin="H2_gpt2_plateau", bug="plateau_mode_max", expected="learning_rate",
        what="H2 whose ReduceLROnPlateau is built with mode='max' on the held-out loss: every improvement "
             "counts as none, the lr falls 10x every third check"),
    "F06_llama_constant_init": dict(
        model="llama", twin="H3_llama_base", bug="constant_init", expected="initialisation",
        what="H3 with every Linear weight set by nn.init.constant_(w, 0.02) instead of normal_(w, 0, 0.02): "
             "the hidden units of each layer start identical"),
    "F07_gpt2_truncated_documents": dict(
        model="gpt2", twin="H2_gpt2_plateau", bug="truncated_documents", expected="data",
        what="H2 whose training set is each file tokenized on its own with truncation to the context "
             "(tokenizer(doc, truncation=True, max_length=129)): one window per file, its first 129 bytes"),
    "F08_llama_adam_no_sqrt": dict(
        model="llama", twin="H3_llama_base", bug="adam_no_sqrt", expected="optimizer",
        what="H3 under a hand-written Adam whose denominator is v_hat + eps instead of sqrt(v_hat) + eps"),
    "F09_nano_label_smoothing_convE": dict(
        model="nano", twin="H4_nano_label_smoothing", bug="label_smoothing_convE", expected="loss_function",
        what="H4 whose smoothed target is written (1 - eps) onehot + 1/V instead of + eps/V: every class gets "
             "1/V, the target carries 1.9 of mass, about half of it uniform"),
    "F10_gpt2_zero_grad_in_accumulation": dict(
        model="gpt2", twin="H5_gpt2_grad_accum", bug="zero_grad_in_accumulation", expected="training_loop",
        what="H5 whose optimizer.zero_grad() sits inside the micro-batch loop: each backward starts from zero, "
             "only the last micro-batch's gradient (2 of 16 sequences) reaches optimizer.step()"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
