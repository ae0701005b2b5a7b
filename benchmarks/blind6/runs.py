"""The runs of the sixth blind benchmark: pure data (no torch), shared by train.py and report.py.

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
    "H2_gpt2_sgd": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="HF GPT2LMHeadModel (sdpa), SGD with Nesterov momentum 0.9, lr 0.3, warm-up 10 then cosine to 10%, "
             "clip 1.0"),
    "H3_llama_base": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="HF LlamaForCausalLM (sdpa, GQA, untied head), Adam lr 2e-3, linear decay to 0"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H4_nano_qat_ste": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with quantisation-aware training: every block Linear uses int8 fake-quantised weights "
             "(symmetric, per tensor) through the straight-through estimator w + (q(w) - w).detach()"),
    "H5_nano_dropout": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with dropout 0.1 on the embeddings and on each sub-layer's output before it is added to the "
             "residual stream (Vaswani et al. 2017, residual dropout)"),
    # ---------------------------------------------------------------- failing
    "F01_nano_qat_no_ste": dict(
        model="nano", twin="H4_nano_qat_ste", bug="qat_no_ste", expected="gradient_flow",
        what="H4 whose fake-quantised weight is used as round(w / s) * s without the straight-through "
             "estimator: torch.round has zero gradient, the block weights get (almost) none"),
    "F02_llama_vocab_rebuilt_at_resume": dict(
        model="llama", twin="H3_llama_base", bug="vocab_rebuilt_at_resume", expected="data",
        what="H3 whose job resumed at step 81 does not find the saved vocabulary and rebuilds it as "
             "sorted(set(text)): from step 81 every byte gets another id (inputs, targets, held-out)"),
    "F03_gpt2_n_inner_ratio": dict(
        model="gpt2", twin="H2_gpt2_sgd", bug="n_inner_ratio", expected="architecture",
        what="H2 built with GPT2Config(n_inner=4), the MLP ratio where the config takes the inner dimension: "
             "every MLP is 128 -> 4 -> 128 instead of 128 -> 512 -> 128"),
    "F04_llama_bce_onehot": dict(
        model="llama", twin="H3_llama_base", bug="bce_onehot", expected="loss_function",
        what="H3 trained with binary_cross_entropy_with_logits(logits, one_hot(y)) (multi-label loss) instead "
             "of cross_entropy(logits, y)"),
    "F05_llama_multiplicative_lr": dict(
        model="llama", twin="H3_llama_base", bug="multiplicative_lr", expected="learning_rate",
        what="H3 whose linear-decay lambda is handed to MultiplicativeLR instead of LambdaLR: the factors "
             "compound, lr = 2e-3 * prod(1 - i/160)"),
    "F06_gpt2_resume_lexicographic": dict(
        model="gpt2", twin="H2_gpt2_sgd", bug="resume_lexicographic_checkpoint", expected="weights",
        what="H2 run as a chain of 20-step jobs, each resuming from sorted(glob('ckpt_*.pt'))[-1]: a string "
             "sort, so from step 101 on every job reloads ckpt_80 (weights and optimizer state)"),
    "F07_gpt2_sgd_dampening": dict(
        model="gpt2", twin="H2_gpt2_sgd", bug="sgd_dampening", expected="optimizer",
        what="H2 under a hand-written Nesterov SGD with dampening=0.9 (= momentum): the momentum buffer is an "
             "average of the gradients, 0.9 buf + 0.1 g, instead of their sum, buf + g"),
    "F08_nano_temperature_in_hard_loss": dict(
        model="nano", twin="H1_nano_base", bug="temperature_in_hard_loss", expected="loss_function",
        what="H1 whose cross-entropy on the labels is computed on logits / 2 (a distillation temperature applied to "
             "the hard-label loss); evaluation uses the logits as they are"),
    "F09_nano_dropout_on_stream": dict(
        model="nano", twin="H5_nano_dropout", bug="dropout_on_stream", expected="residual",
        what="H5 whose blocks apply the dropout to the residual sum, x = drop(x + f(ln(x))), instead of to the "
             "sub-layer output before the addition"),
    "F10_gpt2_memmap_w_plus": dict(
        model="gpt2", twin="H2_gpt2_sgd", bug="memmap_w_plus", expected="data",
        what="H2 whose loader opens the token file with np.memmap(path, dtype=np.uint16, mode='w+', "
             "shape=(n,)) (the writer's line from prepare.py) instead of mode='r': every training id is 0"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
