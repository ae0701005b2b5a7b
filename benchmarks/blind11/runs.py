"""The runs of the eleventh blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": mistral | smollm3 | exaone4. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy: the plain twins
    "H1_mistral_adamw_lrfinder": dict(
        model="mistral", twin=None, bug=None, expected=None,
        what="HF MistralForCausalLM from a config (GQA 4/2, head_dim 32, SwiGLU 352, untied head), AdamW lr 3e-3 "
             "(0.9, 0.95, wd 0.1 on matrices), LambdaLR min(1, (step + 1) / 10) * cosine to 10%, clip 1.0; before "
             "training, a torch-lr-finder-style LR range test (exponential lr 1e-6 -> 1 over at most 40 batches, "
             "stopped when the smoothed loss passes 5x its best) followed by its reset(): the model's and the "
             "optimizer's state dicts restored from copies taken before the test"),
    "H2_smollm3_sgd_nesterov": dict(
        model="smollm3", twin=None, bug=None, expected=None,
        what="HF SmolLM3ForCausalLM from a config (GQA 4/2, SwiGLU 352, tied head), SGD with Nesterov momentum 0.9 "
             "written by hand with torch.optim.SGD's rule (buf = g at the first step, then buf = 0.9 buf + g; "
             "p -= lr (g + 0.9 buf)), lr 0.03, LambdaLR min(1, (step + 1) / 10) * cosine to 10% over the run, clip 1.0"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H3_mistral_sgdr": dict(
        model="mistral", twin=None, bug=None, expected=None,
        what="H1's model (no range test) under AdamW written by hand with torch.optim.AdamW's rule (same betas, "
             "eps, wd) and SGDR warm restarts (Loshchilov & Hutter 2017): 10-step linear warm-up, then cosine "
             "cycles of 50 steps from 3e-3 to 3e-4, restarted at the peak at steps 60 and 110 (the lr jumps 10x "
             "in one step)"),
    "H4_exaone4_lion": dict(
        model="exaone4", twin=None, bug=None, expected=None,
        what="HF Exaone4ForCausalLM from a config (GQA 4/2, QK-norm, post-sublayer RMSNorm, sliding-window layers, "
             "untied head) trained by Lion written by hand after google/automl's lion_pytorch.py (update "
             "sign(0.9 m + 0.1 g), m = 0.99 m + 0.01 g, decoupled decay), converted from the AdamW recipe as "
             "the paper says: lr / 10 = 3e-4, wd x 10 = 1.0 on matrices; warm-up 10 then cosine to 10%, clip 1.0"),
    "H5_smollm3_temperature_sampling": dict(
        model="smollm3", twin=None, bug=None, expected=None,
        what="H2's model under AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine to 10%, "
             "clip 1.0, the logits computed from the decoder's final hidden states with the (tied) output matrix, "
             "F.linear(h, W), and fed by temperature-based sampling over data sources (XLM / mT5: each of the 168 "
             "training modules is a source, sampled with probability proportional to n_bytes ** 0.3), written as "
             "torch's WeightedRandomSampler over every window start of the stream, each start weighted "
             "q(source) / n_starts(source)"),
    # ---------------------------------------------------------------- failing
    "F01_mistral_lrfinder_no_reset": dict(
        model="mistral", twin="H1_mistral_adamw_lrfinder", bug="lrfinder_no_reset", expected="training_loop",
        what="H1 whose LR range test is not followed by reset(): training starts from the weights and the AdamW "
             "state the range test left (it ran the lr up to 1.0), and the LambdaLR built "
             "afterwards finds the range test's initial_lr (1e-6) already set in the param groups and schedules "
             "from it"),
    "F02_mistral_target_column_broadcast": dict(
        model="mistral", twin="H1_mistral_adamw_lrfinder", bug="target_column_broadcast", expected="loss_function",
        what="H1 whose hand-written negative log-likelihood indexes the log-probabilities with the targets kept as "
             "a column, logp[arange(N), y.view(-1, 1)] (the shape prepared for gather): the two index tensors "
             "broadcast to (N, N), so the loss is the mean of -log p_i(y_j) over every position i and every "
             "target j of the batch"),
    "F03_smollm3_sgd_momentum_rezeroed": dict(
        model="smollm3", twin="H2_smollm3_sgd_nesterov", bug="sgd_momentum_rezeroed", expected="optimizer",
        what="H2 whose SGD initialises the momentum buffer in its per-step group set-up without checking whether "
             "it exists (state['momentum_buffer'] = zeros_like(p) at every step): the buffer never carries over, "
             "buf = g, and the Nesterov update is 1.9 g instead of g + 0.9 (0.9 buf + g)"),
    "F04_smollm3_schedule_late_binding": dict(
        model="smollm3", twin="H2_smollm3_sgd_nesterov", bug="schedule_late_binding", expected="learning_rate",
        what="H2 whose LambdaLR lambda reads the run length from the enclosing scope (num_steps) when it is called, "
             "and the evaluation loop reuses that name as its loop variable (for num_steps, (x, y) in "
             "enumerate(val_batches)): from the first evaluation on the schedule sees a run of 1 step, and the "
             "cosine sits at its 10% floor after the warm-up"),
    "F05_mistral_adamw_second_moment_ones": dict(
        model="mistral", twin="H3_mistral_sgdr", bug="adamw_second_moment_ones", expected="optimizer",
        what="H3 whose hand-written AdamW creates the second-moment state with torch.ones_like instead of "
             "torch.zeros_like (the initial accumulator of TF's RMSProp): with the bias correction v / (1 - 0.95^t) "
             "the denominator sqrt(v_hat) is ~4.4 at the first step, 0.75 at step 20, 0.29 at step 50, 0.08 at step "
             "100, against gradients of 1e-3 to 1e-2: the updates are hundreds of times smaller than Adam's at "
             "first and catch up only over the last third of the run"),
    "F06_mistral_bytelevel_corpus": dict(
        model="mistral", twin="H3_mistral_sgdr", bug="bytelevel_corpus", expected="data",
        what="H3 whose training corpus is the byte-level tokenizer's visible form of the text (GPT-2's "
             "bytes_to_unicode: the token strings joined, 'defĠf(x):Ċ', written out as UTF-8) instead of the text "
             "decoded back: every space, newline, tab and non-ASCII byte becomes a two-byte character in training; "
             "the held-out text is read as it is"),
    "F07_exaone4_lion_inplace_update": dict(
        model="exaone4", twin="H4_exaone4_lion", bug="lion_inplace_update", expected="optimizer",
        what="H4 whose Lion computes the update in place on its state, update = exp_avg.mul_(b1).add_(g, 1 - b1) "
             "then p.add_(update.sign_(), -lr): the momentum buffer itself is overwritten by the sign (+-1) at "
             "every step, so 0.99 * sign dwarfs every later gradient and each weight keeps moving in the direction "
             "of its first update"),
    "F08_exaone4_lion_no_sign": dict(
        model="exaone4", twin="H4_exaone4_lion", bug="lion_no_sign", expected="optimizer",
        what="H4 whose Lion applies the interpolation without its sign, p -= lr (0.9 m + 0.1 g) (the sign() "
             "missing from the update term): momentum SGD at Lion's lr of 3e-4, steps thousands of times smaller than "
             "Lion's"),
    "F09_smollm3_sampler_source_weights": dict(
        model="smollm3", twin="H5_smollm3_temperature_sampling", bug="sampler_source_weights", expected="data",
        what="H5 whose WeightedRandomSampler is given the per-source weights (168 of them) instead of the "
             "per-start weights: it draws indices 0 ... 167 only, so every training window starts in the first 168 "
             "bytes of the stream (all within the first 296 bytes: the opening docstring of __future__.py), drawn "
             "with the probabilities of the sources"),
    "F10_smollm3_head_weight_detached": dict(
        model="smollm3", twin="H5_smollm3_temperature_sampling", bug="head_weight_detached",
        expected="gradient_flow",
        what="H5 whose forward takes the output matrix as the input embedding's weight, detached "
             "(F.linear(h, embed_tokens.weight.detach()), 'the tied matrix already gets its gradient through the "
             "input lookup'): the loss's gradient no longer reaches the matrix through the head, only through the "
             "input lookup; the decoder layers and norms train as usual"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
assert max(sum(r["twin"] == h for r in RUNS.values()) for h in RUNS) <= 2
