"""The runs of the eighth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": book | phi3 | starcoder2. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy: the plain twins
    "H1_book_alibi_base": dict(
        model="book", twin=None, bug=None, expected=None,
        what="'LLMs from scratch'-style GPT written by hand (W_query/W_key/W_value/out_proj, hand-written "
             "LayerNorm and tanh-GELU, PyTorch default init, untied head) with ALiBi attention biases instead of "
             "position embeddings, AdamW lr 1e-3 (0.9, 0.95, wd 0.1), warm-up 10 then cosine to 10%, clip 1.0; "
             "the loop is written as an epoch loop ('epochs' of 40 steps)"),
    "H2_phi3_onecycle": dict(
        model="phi3", twin=None, bug=None, expected=None,
        what="HF Phi3ForCausalLM from a config (fused qkv_proj and gate_up_proj, GQA 4/2, RoPE, RMSNorm, untied), "
             "AdamW (wd 0.1) under torch's OneCycleLR (max lr 2e-3, 15% cosine warm-up, beta1 cycled "
             "0.95 -> 0.85 -> 0.95), stepped after every optimizer step, clip 1.0"),
    "H3_starcoder2_adafactor": dict(
        model="starcoder2", twin=None, bug=None, expected=None,
        what="HF Starcoder2ForCausalLM from a config (GQA 4/2, RoPE, LayerNorm with bias, GELU MLP with biases, "
             "tied head), transformers' Adafactor with an external lr (lr 3e-3, relative_step=False, "
             "scale_parameter=False, warmup_init=False), LambdaLR warm-up 10 then linear decay to 10%, no clipping"),
    # ---------------------------------------------------------------- healthy: unusual but legitimate
    "H4_book_lamb_zero_init": dict(
        model="book", twin=None, bug=None, expected=None,
        what="H1's model with every residual branch's output layer (attention out_proj, the FFN's second Linear) "
             "zero-initialised, trained with a hand-written LAMB (You et al. 2019: Adam direction, decoupled wd "
             "0.01, layer-wise trust ratio ||w|| / ||r||, 1 when either norm is 0), lr 1e-2, warm-up 10 then "
             "cosine to 10%, clip 1.0"),
    "H5_phi3_input_noising": dict(
        model="phi3", twin=None, bug=None, expected=None,
        what="H2 with data noising of the inputs (Xie et al. 2017; BERT's random-token corruption): 20% of the input "
             "bytes of every window replaced by uniformly random bytes; the targets are the clean next bytes"),
    # ---------------------------------------------------------------- failing
    "F01_book_lamb_no_zero_guard": dict(
        model="book", twin="H4_book_lamb_zero_init", bug="lamb_no_zero_guard", expected="optimizer",
        what="H4 whose LAMB computes the trust ratio as ||w|| / ||r|| without the guard for ||w|| = 0: the "
             "zero-initialised output layers (and the LayerNorm shifts) get a trust ratio of 0 and never move"),
    "F02_phi3_noise_labels_aliased": dict(
        model="phi3", twin="H5_phi3_input_noising", bug="noise_labels_aliased", expected="data",
        what="H5 whose loader returns x, y = chunk[:, :-1], chunk[:, 1:] as views of one tensor (no .clone()): "
             "the in-place noising of x also rewrites the targets, so 20% of the targets are random bytes"),
    "F03_phi3_onecycle_stepped_with_loss": dict(
        model="phi3", twin="H2_phi3_onecycle", bug="onecycle_step_loss", expected="learning_rate",
        what="H2 whose loop calls scheduler.step(loss.item()) (the ReduceLROnPlateau call): OneCycleLR takes the "
             "loss as its step number, so the lr stays at the bottom of the warm-up (3e-4 falling to 1.5e-4)"),
    "F04_starcoder2_adafactor_scale_parameter": dict(
        model="starcoder2", twin="H3_starcoder2_adafactor", bug="adafactor_scale_parameter", expected="learning_rate",
        what="H3 whose Adafactor is built Adafactor(params, lr=3e-3, relative_step=False, warmup_init=False), "
             "leaving scale_parameter at its default True: every tensor's step is multiplied by max(1e-3, RMS(w)), "
             "~0.02 for the matrices"),
    "F05_book_qkv_torch_rand": dict(
        model="book", twin="H1_book_alibi_base", bug="qkv_torch_rand", expected="initialisation",
        what="H1 whose query/key/value projections are nn.Parameter(torch.rand(d_in, d_out)) (the book's "
             "SelfAttention_v1 form): uniform on [0, 1), mean 0.5, instead of nn.Linear's init"),
    "F06_book_loss_last_position": dict(
        model="book", twin="H1_book_alibi_base", bug="loss_last_position", expected="loss_function",
        what="H1 whose loss is the book's classification loss, F.cross_entropy(model(x)[:, -1, :], y[:, -1]): only "
             "the last position of each window (16 of the 2048 targets per step) is trained"),
    "F07_book_reset_every_epoch": dict(
        model="book", twin="H1_book_alibi_base", bug="reset_every_epoch", expected="training_loop",
        what="H1 whose reset_weights() call (every module's reset_parameters(), meant once before training) sits "
             "inside the epoch loop: the weights are re-initialised at steps 40, 80 and 120 while the optimizer "
             "keeps its state"),
    "F08_starcoder2_param_value_clamp": dict(
        model="starcoder2", twin="H3_starcoder2_adafactor", bug="param_value_clamp", expected="weights",
        what="H3 with a 'clip_value 0.1' step written as WGAN's weight clipping: after every optimizer step "
             "for p in model.parameters(): p.data.clamp_(-0.1, 0.1) (the LayerNorm gains of 1 become 0.1)"),
    "F09_starcoder2_chunk_index_as_offset": dict(
        model="starcoder2", twin="H3_starcoder2_adafactor", bug="chunk_index_as_offset", expected="data",
        what="H3 whose sampler draws batch numbers, torch.randint(len(loader), ...) with len(loader) = len(data) // "
             "(16 * 129), and the loader uses them as byte offsets: every training window starts in the first 2.3 KB"),
    "F10_starcoder2_frozen_tied_embedding": dict(
        model="starcoder2", twin="H3_starcoder2_adafactor", bug="frozen_tied_embedding", expected="gradient_flow",
        what="H3 whose input embedding is frozen on purpose, embed_tokens.weight.requires_grad_(False); the model "
             "ties lm_head to it, so the output head is frozen at its random init too"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
