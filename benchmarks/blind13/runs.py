"""The runs of the thirteenth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": apertus | seedoss | lfm2 | olmo | cohere2. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy
    "H1_apertus_unlikelihood": dict(
        model="apertus", twin=None, bug=None, expected=None,
        what="HF ApertusForCausalLM from a config (GQA 4/2, head_dim 32, xIELU MLP 352 without gate, QK-norm, "
             "RMSNorm, untied head), torch AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), transformers' "
             "get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=160) (with a 10% "
             "floor), clip 1.0; the loss is token-level unlikelihood training (Welleck et al. 2019): cross-entropy + "
             "alpha 1.0 x the mean over positions of -sum_c log(1 - p_c) over the negative candidates c = the "
             "distinct bytes of the row's previous context, the target itself excluded"),
    "H2_seedoss_packed_docmask": dict(
        model="seedoss", twin=None, bug=None, expected=None,
        what="HF SeedOssForCausalLM from a config (GQA 4/2, head_dim 32, SwiGLU 352, RMSNorm, untied head), torch "
             "AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine to 10%, clip 1.0, trained on "
             "packed documents: the training modules cut at their top-level separators (two blank lines) into 1,791 "
             "documents joined by a separator byte 0 (absent from the text); each 128-byte window gets a custom 4D "
             "boolean attention mask (B, 1, T, T), block-diagonal over documents and causal, and position_ids that "
             "restart at every document, no label on the prediction made at a separator (the 'neat packing' / "
             "4D-mask recipe); held-out windows use the model's default causal mask"),
    "H3_lfm2_cautious_adam_atan2": dict(
        model="lfm2", twin=None, bug=None, expected=None,
        what="HF Lfm2ForCausalLM from a config (Liquid LFM2 hybrid: layers conv / full_attention / conv, gated "
             "short convolutions, QK-norm, SwiGLU 256, tied head), trained by Adam-atan2 written by hand after "
             "lucidrains/adam-atan2-pytorch (update = a atan2(m_hat, b sqrt(v_hat)), a 1.27, b 1, no eps; betas "
             "0.9/0.95) with the cautious mask of Liang et al. 2024 (the update kept where it agrees in sign with "
             "the gradient, rescaled by 1/mean(mask)) and fully decoupled weight decay (wd / init_lr: 3e-4 per "
             "step at the peak lr, on matrices), lr 3e-3, warm-up 10 then cosine to 10%, clip 1.0"),
    "H4_olmo_sgd_group_lrs": dict(
        model="olmo", twin=None, bug=None, expected=None,
        what="HF OlmoForCausalLM from a config (OLMo-1: non-parametric LayerNorm, no biases, SwiGLU 352, untied "
             "head), torch SGD with Nesterov momentum 0.9 on parameter groups that each carry their own lr (matrices "
             "0.3, vectors and embeddings 0.3 without decay, no optimizer-level lr), warm-up 16 steps (10%) then "
             "cosine to 10% (HF get_cosine_schedule_with_warmup style), clip 1.0"),
    "H5_cohere2_confidence_penalty": dict(
        model="cohere2", twin=None, bug=None, expected=None,
        what="HF Cohere2ForCausalLM from a config (parallel attention and MLP blocks, LayerNorm without bias, "
             "head tied to the embedding, logit_scale 1.0, every layer full attention), torch AdamW lr 3e-3 (0.9, "
             "0.95, wd 0.1 on matrices), warm-up 10 then cosine to 10%, clip 1.0; the loss is the confidence "
             "penalty of Pereyra et al. 2017: cross-entropy - beta x the mean entropy of the predicted distribution "
             "(beta 0.1), after an init pass that redraws every block matrix from N(0, 0.02)"),
    # ---------------------------------------------------------------- failing
    "F01_apertus_schedule_args_swapped": dict(
        model="apertus", twin="H1_apertus_unlikelihood", bug="schedule_args_swapped", expected="learning_rate",
        what="H1 whose schedule is built get_cosine_schedule_with_warmup(optimizer, steps, warmup): the two "
             "counts passed positionally in the wrong order, so the warm-up lasts the whole run (lr = 3e-3 * "
             "step / 160: 1.9e-4 at step 10) and the cosine never starts (the peak at the last step)"),
    "F02_apertus_ul_exp_omitted": dict(
        model="apertus", twin="H1_apertus_unlikelihood", bug="ul_exp_omitted", expected="loss_function",
        what="H1 whose unlikelihood term takes 1 - lprobs where 1 - lprobs.exp() was meant (the reference "
             "code's probs = lprobs.exp() left out): -log(1 - log p_c) decreases without bound as the "
             "candidates' log-probabilities fall, so the term drives every previously seen byte other than the "
             "target towards probability 0"),
    "F03_seedoss_docmask_not_causal": dict(
        model="seedoss", twin="H2_seedoss_packed_docmask", bug="docmask_not_causal", expected="mask",
        what="H2 whose 4D mask is only the block-diagonal document mask, doc[t] == doc[s], without '& (s <= t)': "
             "transformers uses a 4D mask as given, so every position attends to the rest of its document, its "
             "own next byte included; the held-out pass (the default causal mask) has no such leak"),
    "F04_seedoss_docmask_float": dict(
        model="seedoss", twin="H2_seedoss_packed_docmask", bug="docmask_float", expected="mask",
        what="H2 whose 4D mask is handed over as mask.float() (1.0 = attend, 0.0 = not, as a 2D padding mask is "
             "written): transformers treats a floating 4D mask as additive, so it adds 1 to the allowed scores "
             "and 0 to the others: nothing is masked, every position sees the whole window, future and other "
             "documents included"),
    "F05_lfm2_cautious_additive_convention": dict(
        model="lfm2", twin="H3_lfm2_cautious_adam_atan2", bug="cautious_additive_convention",
        expected="optimizer",
        what="H3 whose cautious mask is written in the additive convention of optax (params + update: keep where "
             "update * grad < 0) inside an optimizer that subtracts the update (p -= lr * update): it keeps "
             "exactly the coordinates whose step goes against the current gradient, rescaled by 1/mean(mask)"),
    "F06_lfm2_decoupled_wd_compounded": dict(
        model="lfm2", twin="H3_lfm2_cautious_adam_atan2", bug="decoupled_wd_compounded", expected="optimizer",
        what="H3 whose fully decoupled weight decay divides the group's wd by init_lr inside the loop over the "
             "group's parameters (wd /= init_lr, lucidrains/adam-atan2-pytorch#5), so the k-th matrix is decayed "
             "with wd / init_lr^k: the second matrix shrinks by 10% a step, the third and later ones are "
             "multiplied by factors far below -1 (non-finite within 10 steps)"),
    "F07_olmo_clip_filter_exhausted": dict(
        model="olmo", twin="H4_olmo_sgd_group_lrs", bug="clip_filter_exhausted", expected="training_loop",
        what="H4 whose clipping is handed filter(lambda p: p.requires_grad, model.parameters()), built once before "
             "the loop: a filter object is an iterator, so the first clip_grad_norm_ call consumes it and every "
             "later call clips an empty list (no error, total norm 0): SGD at lr 0.3 without clipping after step 0"),
    "F08_olmo_warmup_ratio_as_steps": dict(
        model="olmo", twin="H4_olmo_sgd_group_lrs", bug="warmup_ratio_as_steps", expected="warmup",
        what="H4 whose schedule is given the warm-up ratio (0.1) where the number of warm-up steps is expected "
             "(num_warmup_steps=0.1): the factor is 0 at step 0 and the full peak lr 0.3 from step 1: no warm-up"),
    "F09_cohere2_init_normal_positional": dict(
        model="cohere2", twin="H5_cohere2_confidence_penalty", bug="init_normal_positional",
        expected="initialisation",
        what="H5 whose init pass over the block matrices calls nn.init.normal_(w, 0.02) meaning std 0.02: the "
             "second positional parameter of normal_(tensor, mean=0.0, std=1.0) is the mean, so every Linear "
             "weight of the blocks is drawn from N(0.02, 1)"),
    "F10_cohere2_entropy_summed": dict(
        model="cohere2", twin="H5_cohere2_confidence_penalty", bug="entropy_summed", expected="loss_function",
        what="H5 whose entropy term is summed over the 2,048 positions of the batch (reduction 'sum') while the "
             "cross-entropy is averaged: the penalty weighs 2,048 times beta (205) against the likelihood, and "
             "the model is pushed to the uniform distribution"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
assert max(sum(r["twin"] == h for r in RUNS.values()) for h in RUNS) <= 2
