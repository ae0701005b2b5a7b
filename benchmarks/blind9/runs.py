"""The runs of the ninth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": gemma | olmo2 | cohere. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy: the plain twins
    "H1_gemma_adamw_seqlr": dict(
        model="gemma", twin=None, bug=None, expected=None,
        what="HF GemmaForCausalLM from a config (MQA 4/1, head_dim 32, GeGLU 352, RMSNorm x*(1+w), embeddings scaled "
             "by sqrt(d), tied head), AdamW lr 2e-3 (0.9, 0.95, wd 0.1 on matrices) under torch's SequentialLR("
             "[LinearLR 0.1 -> 1 over 10 steps, CosineAnnealingLR to 2e-4]), clip 1.0; batches collated by "
             "pad_sequence(batch_first=True)"),
    "H3_cohere_inverse_sqrt": dict(
        model="cohere", twin=None, bug=None, expected=None,
        what="HF CohereForCausalLM from a config (one LayerNorm feeding attention and MLP in parallel, interleaved "
             "RoPE, tied head, logit_scale 1.0), Adam (0.9, 0.98, eps 1e-9) under fairseq's inverse-square-root "
             "schedule (warm-up from 2e-5 to lr 2e-3 over 10 steps, then 2e-3 * sqrt(10 / step)), clip 1.0"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H2_olmo2_ranger_flatcos": dict(
        model="olmo2", twin=None, bug=None, expected=None,
        what="HF Olmo2ForCausalLM from a config (RMSNorm on each branch's output, QK-norm, SwiGLU 352, untied head), "
             "Ranger: RAdam lr 8e-3 (0.95, 0.999, eps 1e-5, decoupled wd 0.01) inside Lookahead (k 6, alpha 0.5: "
             "every 6 steps the weights are pulled half-way back to the slow weights), fastai's flat-then-cosine "
             "schedule (flat for 72% of the run, then cosine to 0), no clipping"),
    "H4_olmo2_prodigy": dict(
        model="olmo2", twin=None, bug=None, expected=None,
        what="H2's model trained by Prodigy (hand-written after konstmish/prodigy: lr 1.0, betas (0.9, 0.99), "
             "decoupled wd 0.01, use_bias_correction, safeguard_warmup), LambdaLR 10-step warm-up then cosine to 0, "
             "clip 1.0: the optimizer estimates its own step size d (1e-6 at the start, ~2.4e-3 from step ~70); the "
             "group lr the Watch sees is 1.0"),
    "H5_gemma_fgm": dict(
        model="gemma", twin=None, bug=None, expected=None,
        what="H1 with FGM adversarial training on the embedding (Miyato et al. 2017): after the clean backward the "
             "(tied) embedding matrix is moved by 1.0 * g / ||g||, a second forward/backward on the same batch adds "
             "the adversarial gradient, the embedding is restored, then the optimizer steps"),
    # ---------------------------------------------------------------- failing
    "F01_gemma_seq_first_collate": dict(
        model="gemma", twin="H1_gemma_adamw_seqlr", bug="seq_first_collate", expected="data",
        what="H1 whose collate function calls pad_sequence(windows) with batch_first left at its default False: "
             "the batch comes out (129, 16) and the loop cuts it as (B, T + 1), so each training row is 15 bytes "
             "taken one each from 16 different windows at the same offset"),
    "F02_olmo2_balanced_class_weights": dict(
        model="olmo2", twin="H2_olmo2_ranger_flatcos", bug="balanced_class_weights", expected="loss_function",
        what="H2 whose next-byte loss is F.cross_entropy(..., weight=w) with sklearn's 'balanced' class weights "
             "n / (256 * count(byte)) computed from the training bytes (the space weighs 0.013, a byte seen once "
             "18,000)"),
    "F03_olmo2_lookahead_zero_slow": dict(
        model="olmo2", twin="H2_olmo2_ranger_flatcos", bug="lookahead_zero_slow", expected="optimizer",
        what="H2 whose Lookahead creates its slow weights as zeros instead of a copy of the initial weights: the "
             "first synchronisation (after step 6) sets every weight to 0 + 0.5 * (fast - 0), half its value, norm "
             "gains included; later synchronisations are correct"),
    "F04_cohere_default_logit_scale": dict(
        model="cohere", twin="H3_cohere_inverse_sqrt", bug="cohere_default_logit_scale", expected="architecture",
        what="H3 built without setting logit_scale, so CohereConfig's default 0.0625 (Command R's) applies: the "
             "model's logits are multiplied by 1/16, in training and at evaluation"),
    "F05_cohere_invsqrt_lr_swapped": dict(
        model="cohere", twin="H3_cohere_inverse_sqrt", bug="invsqrt_lr_swapped", expected="learning_rate",
        what="H3 whose inverse-square-root schedule gets its two learning rates in each other's place (lr 2e-5, "
             "warmup_init_lr 2e-3): the 'warm-up' falls from 1.8e-3 to 2e-5 in 10 steps and the decay starts "
             "from 2e-5 (5e-6 at the end)"),
    "F06_olmo2_prodigy_adam_lr": dict(
        model="olmo2", twin="H4_olmo2_prodigy", bug="prodigy_adam_lr", expected="learning_rate",
        what="H4 built with lr=1e-3, the AdamW recipe's learning rate: Prodigy multiplies its estimated step size "
             "by the group lr, so every step is 1000x smaller (and d, estimated from the distance travelled, "
             "never leaves its start value 1e-6)"),
    "F07_gemma_fgm_backup_by_reference": dict(
        model="gemma", twin="H5_gemma_fgm", bug="fgm_backup_by_reference", expected="weights",
        what="H5 whose FGM backs the embedding up as param.data (no .clone()): restore() writes the perturbed "
             "values back, so every step's perturbation 1.0 * g / ||g|| stays in the (tied) embedding"),
    "F08_gemma_fgm_restore_after_step": dict(
        model="gemma", twin="H5_gemma_fgm", bug="fgm_restore_after_step", expected="training_loop",
        what="H5 whose loop calls fgm.restore() after optimizer.step() instead of before: every step's update to "
             "the embedding (and so to the tied head) is overwritten by the pre-step backup"),
    "F09_gemma_fgm_zero_grad_before_adv": dict(
        model="gemma", twin="H5_gemma_fgm", bug="fgm_zero_grad_before_adv", expected="training_loop",
        what="H5 whose loop calls optimizer.zero_grad() between the clean backward and the adversarial one (the "
             "zero_grad of PGD's inner loop, without its backup_grad/restore_grad): every step is taken on the "
             "adversarial gradient alone, at the perturbed embedding"),
    "F10_gemma_fgsm_sign_eps": dict(
        model="gemma", twin="H5_gemma_fgm", bug="fgsm_sign_eps", expected="loss_function",
        what="H5 whose attack is FGSM's epsilon * sign(g) with FGM's epsilon 1.0: every entry of the embedding "
             "matrix (std ~0.02) moves by +-1 for the adversarial pass, so the adversarial half of the loss is "
             "computed on a destroyed embedding"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
