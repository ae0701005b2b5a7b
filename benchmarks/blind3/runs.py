"""The runs of the third blind benchmark: pure data (no torch), shared by train.py and report.py.

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
    "H4_nano_muon": dict(
        model="nano", twin=None, bug=None, expected=None,
        what="H1 with the blocks' 2-D weights under Muon (lr 0.02, Nesterov momentum 0.95, Newton-Schulz "
             "orthogonalised updates) and the embedding, norms and biases under AdamW, in one optimizer "
             "(KellerJordan/Muon's MuonWithAuxAdam); H1's schedule and clipping"),
    "H5_gpt2_seqlen_warmup": dict(
        model="gpt2", twin=None, bug=None, expected=None,
        what="H2 with a sequence-length warm-up: windows truncated to 16 bytes at step 0, growing linearly "
             "(multiples of 8) to 128 at step 80 (DeepSpeed curriculum learning)"),
    "H6_llama_mtp": dict(
        model="llama", twin=None, bug=None, expected=None,
        what="H3 with a DeepSeek-V3-style multi-token-prediction module (projection of [norm(h); "
             "norm(emb(next))], one extra decoder layer, shared final norm and head) predicting the byte "
             "after next; loss = main + 0.3 * MTP"),
    # ---------------------------------------------------------------- failing
    "F01_llama_unshuffled": dict(
        model="llama", twin="H3_llama_base", bug="unshuffled", expected="data",
        what="H3 fed the windows in file order (a DataLoader with shuffle=False): each batch is 16 "
             "consecutive windows, the run walks through the first ~330 KB of the modules"),
    "F02_llama_pad_is_space": dict(
        model="llama", twin="H3_llama_base", bug="pad_is_space", expected="loss_function",
        what="H3 whose loss ignores the pad id (labels == pad_id -> -100), and the pad id is the space byte: "
             "no space in the text (27% of the bytes) is ever a target"),
    "F03_nano_decoupled_wd_torch_value": dict(
        model="nano", twin="H1_nano_base", bug="decoupled_wd_torch_value", expected="optimizer",
        what="H1 with Composer's DecoupledAdamW (decay scaled by lr/lr0, not by lr) given torch AdamW's "
             "weight_decay 0.1: the matrices shrink by 10% a step"),
    "F04_nano_zero_init_linear": dict(
        model="nano", twin="H1_nano_base", bug="zero_init_linear", expected="initialisation",
        what="H1 whose _init_weights zeroes every nn.Linear (meant: the output projections only): all "
             "block matrices and the tied embedding start at 0"),
    "F05_nano_sdpa_triu_mask": dict(
        model="nano", twin="H1_nano_base", bug="sdpa_triu_mask", expected="mask",
        what="H1 with the attention through F.scaled_dot_product_attention and the boolean mask "
             "torch.triu(ones, 1) (MultiheadAttention's convention): each position attends only to later ones"),
    "F06_gpt2_resume_strict_false": dict(
        model="gpt2", twin="H2_gpt2_base", bug="resume_strict_false", expected="weights",
        what="H2 'restarted' after step 80 from a checkpoint whose keys carry torch.compile's '_orig_mod.' "
             "prefix, loaded with strict=False: no weight is loaded (the model is back to its init), the "
             "optimizer state is"),
    "F07_nano_layernorm_detached_stats": dict(
        model="nano", twin="H1_nano_base", bug="layernorm_detached_stats", expected="gradient_flow",
        what="H1 with a hand-written LayerNorm whose mean and variance are .detach()ed: the same forward, "
             "no gradient through the statistics"),
    "F08_gpt2_zero_grad_before_step": dict(
        model="gpt2", twin="H2_gpt2_base", bug="zero_grad_before_step", expected="training_loop",
        what="H2 with optimizer.zero_grad() between loss.backward() and optimizer.step(): the step never "
             "sees a gradient"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
