"""The runs of the seventh blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": nano | qwen2 | neox. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy: the plain twins
    "H1_nano_base": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="nanoGPT-style (hand-written attention, tied embedding), AdamW(0.9, 0.95, wd 0.1 on matrices), "
             "lr 1e-3, 2 micro-batches of 8 per step, nanochat-style lr multiplier (10-step warm-up, constant, "
             "linear warm-down to 0 over the second half), clip 1.0"),
    "H2_qwen2_muon": dict(
        model="qwen2", twin=None, bug=None, expected=None,
        what="HF Qwen2ForCausalLM (sdpa, GQA, SwiGLU, untied head; every residual add and the RMSNorm after it "
             "computed by a fused add+RMSNorm autograd Function), Muon (lr 0.02, Nesterov 0.95, 5 Newton-Schulz "
             "steps) on the decoder layers' matrices and Adam (lr 1e-2) on embedding, head, norms and biases, "
             "warm-up 10 then cosine to 10%"),
    "H3_neox_warmup_cosine": dict(
        model="neox", twin=None, bug=None, expected=None,
        what="HF GPTNeoXForCausalLM (parallel residual, rotary on 25% of each head, untied head), AdamW lr 2e-3 "
             "(0.9, 0.95, wd 0.01), LambdaLR cosine decay to 10% over 160 steps wrapped by a pytorch_warmup-style "
             "LinearWarmup(10), clip 1.0"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H4_nano_gmp": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with gradual magnitude pruning (Zhu & Gupta 2017): every block matrix and the tied embedding pruned "
             "by |w| to a sparsity rising as 0.8 (1 - (1 - t/n)^3) at steps 10, 20, ..., 90, masks re-applied after "
             "every update"),
    "H5_nano_amp_fused_ce": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with Gemma-2 final-logit soft-capping (30 tanh(z/30)), the loss computed by a hand-written fused "
             "linear + soft-cap + cross-entropy autograd Function, in PyTorch's AMP loop with dynamic loss "
             "scaling (GradScaler, scale 2^16, unscale_ before clipping), Adam eps 1e-6"),
    # ---------------------------------------------------------------- failing
    "F01_nano_gmp_signed_scores": dict(
        model="nano", twin="H4_nano_gmp", bug="gmp_signed_scores", expected="weights",
        what="H4 whose pruning score is the weight w itself, not |w|: each pruning step zeroes the most negative "
             "weights (the largest negative ones first) instead of the smallest in magnitude"),
    "F02_nano_amp_clip_before_unscale": dict(
        model="nano", twin="H5_nano_amp_fused_ce", bug="clip_before_unscale", expected="training_loop",
        what="H5 whose clip_grad_norm_(…, 1.0) runs before scaler.unscale_: it clips the loss-scaled gradients, "
             "which scaler.step then divides by 2^16 (every step's gradient norm becomes 1/65536)"),
    "F03_nano_amp_ce_ignores_grad_output": dict(
        model="nano", twin="H5_nano_amp_fused_ce", bug="ce_ignores_grad_output", expected="precision",
        what="H5 whose fused cross-entropy Function returns the gradients it precomputed without multiplying by "
             "grad_output: the loss scale (and the 1/2 of the accumulation) never reach the gradients, which "
             "scaler.step then divides by 2^16"),
    "F04_qwen2_muon_on_embed_and_head": dict(
        model="qwen2", twin="H2_qwen2_muon", bug="muon_on_embed_head", expected="optimizer",
        what="H2 whose Muon parameter list is every matrix of the model ([p for p in model.parameters() if "
             "p.ndim >= 2]), so the token embedding and the output head are orthogonalised by Muon too"),
    "F05_qwen2_fused_addnorm_backward": dict(
        model="qwen2", twin="H2_qwen2_muon", bug="fused_addnorm_backward", expected="gradient_flow",
        what="H2 whose fused add+RMSNorm backward sends the residual stream's incoming gradient through the "
             "norm's Jacobian together with the norm output's, (d_res + d_out) J, instead of d_res + d_out J"),
    "F06_neox_cosine_after_warmup": dict(
        model="neox", twin="H3_neox_warmup_cosine", bug="scheduler_after_warmup", expected="learning_rate",
        what="H3 whose LambdaLR is created after the LinearWarmup wrapper, which has already dampened "
             "the optimizer's lr to lr/10: the LambdaLR base lr is 2e-4 instead of 2e-3 for the whole run"),
    "F07_nano_progress_in_microbatches": dict(
        model="nano", twin="H1_nano_base", bug="progress_in_microbatches", expected="learning_rate",
        what="H1 whose lr multiplier's progress counts micro-batches (2 per optimizer step) and is not clamped: "
             "the warm-down starts at step 40, reaches 0 at step 80 and goes on below 0 (lr -1e-3 at step 120, "
             "-2e-3 at step 160)"),
    "F08_nano_softcap_times_logits": dict(
        model="nano", twin="H5_nano_amp_fused_ce", bug="softcap_times_logits", expected="loss_function",
        what="H5 whose fused loss applies the soft-cap as z * tanh(z / 30) instead of 30 * tanh(z / 30) (the "
             "model's own forward, used for evaluation, keeps the right one)"),
    "F09_nano_attn_proj_created_in_forward": dict(
        model="nano", twin="H1_nano_base", bug="proj_created_in_forward", expected="architecture",
        what="H1 whose attention returns nn.Linear(C, C)(y), a layer created inside forward, instead of "
             "self.c_proj(y): every call uses a new randomly initialised output projection that is never trained"),
    "F10_nano_str_bytes_corpus": dict(
        model="nano", twin="H1_nano_base", bug="str_bytes_corpus", expected="data",
        what="H1 whose training corpus is prepared with str(file_bytes) instead of file_bytes.decode(): every file "
             "becomes its Python repr b'...' (newlines, tabs, quotes, backslashes and non-ASCII bytes written as "
             "escape sequences); the held-out text is read as it is"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
