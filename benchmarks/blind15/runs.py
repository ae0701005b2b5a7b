"""The runs of the fifteenth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": olmoe | gpt1. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy
    "H1_olmoe_balanced": dict(
        model="olmoe", twin=None, bug=None, expected=None,
        what="HF OlmoeForCausalLM from a config (OLMoE: a sparse mixture of 8 SwiGLU experts per layer, top-2 "
             "routing without renormalising the two gate weights, QK-norm, RoPE, untied head), trained on "
             "cross-entropy + 0.01 x the load-balancing loss + 0.001 x the router z-loss (OLMoE's recipe), torch "
             "AdamW lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine to 10%, clip 1.0"),
    "H2_gpt1_postln_warmup": dict(
        model="gpt1", twin=None, bug=None, expected=None,
        what="HF OpenAIGPTLMHeadModel from a config (GPT-1: post-LayerNorm blocks, LN(x + sublayer(x)), learned "
             "positions, GELU MLP 512, head tied to the token embedding), torch AdamW lr 1e-3 (0.9, 0.999, "
             "wd 0.01 on matrices), GPT-1's schedule: the lr rises linearly from 0 over 20 steps, then a cosine "
             "to 0; clip 1.0"),
    "H3_gpt1_bf16_adamax": dict(
        model="gpt1", twin=None, bug=None, expected=None,
        what="HF OpenAIGPTLMHeadModel as H2, every forward (and the loss) under torch.autocast('cpu', "
             "bfloat16), one autocast context per forward, fp32 master weights; torch Adamax (the infinity-norm "
             "Adam of Kingma & Ba, section 7.1) lr 2e-3, betas (0.9, 0.999), warm-up 10 then cosine to 10%, "
             "clip 1.0"),
    "H4_olmoe_memory_kv": dict(
        model="olmoe", twin=None, bug=None, expected=None,
        what="HF OlmoeForCausalLM as H1 (same losses) with 16 learned persistent memory key/value vectors per "
             "head prepended to every layer's keys and values (x-transformers' num_mem_kv; Sukhbaatar et al. "
             "2019), through an attention function registered with transformers' AttentionInterface (sdpa with "
             "a bottom-right-aligned causal mask over [memory; text]); AdamW written out (torch's lerp form), "
             "lr 3e-3 (0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine to 10%, clip 1.0"),
    "H5_gpt1_rdrop": dict(
        model="gpt1", twin=None, bug=None, expected=None,
        what="HF OpenAIGPTLMHeadModel as H2 with dropout 0.1 (embeddings, residual branches, attention), trained "
             "with R-Drop (Liang et al. 2021): two forward passes with different dropout masks, loss = the mean "
             "of the two cross-entropies + 1.0 x the symmetric KL between the two predicted distributions; "
             "windows drawn from the global torch RNG (nanoGPT's get_batch), seeded once; torch AdamW lr 1e-3 "
             "(0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine to 10%, clip 1.0"),
    # ---------------------------------------------------------------- failing
    "F01_olmoe_router_topk_swapped": dict(
        model="olmoe", twin="H1_olmoe_balanced", bug="router_topk_swapped", expected="routing",
        what="H1 whose router unpacks torch.topk's (values, indices) as (indices, values), the dtype error of the "
             "expert one-hot silenced with .long(): every token goes to expert 0 in both slots, weighted by the "
             "numbers of its two intended experts (0 to 7), and the router gets no gradient from the task loss"),
    "F02_olmoe_pair_unpacked_swapped": dict(
        model="olmoe", twin="H1_olmoe_balanced", bug="inputs_targets_unpacked_swapped", expected="data",
        what="H1 whose loop unpacks the collated (inputs, targets) pair in the other order, y, x = batch: the model "
             "reads bytes 1..T of each window and is trained to output bytes 0..T-1, i.e. the byte before the one "
             "it reads, which it has already seen"),
    "F03_gpt1_warmup_dampens_current_lr": dict(
        model="gpt1", twin="H2_gpt1_postln_warmup", bug="warmup_dampens_current_lr", expected="warmup",
        what="H2 whose schedule is written with torch's chainable CosineAnnealingLR after a hand-written linear "
             "warm-up that multiplies the current lr by the warm-up factor, g['lr'] *= (k + 1) / 20, where the "
             "initial lr was meant: the factors compound, so after the warm-up the lr is 1e-3 x 20!/20^20 "
             "(about 2e-11), and the chainable cosine carries that on"),
    "F04_gpt1_zero_head_tied": dict(
        model="gpt1", twin="H2_gpt1_postln_warmup", bug="zero_head_tied", expected="initialisation",
        what="H2 whose init zeroes the output head (modded-nanogpt's zero-initialised lm_head) in a model whose "
             "head is tied to the token embedding: the token embedding starts at 0 too, every byte enters the "
             "model as the same (zero) vector plus its position"),
    "F05_gpt1_autocast_whole_loop": dict(
        model="gpt1", twin="H3_gpt1_bf16_adamax", bug="autocast_whole_loop", expected="precision",
        what="H3 with one torch.autocast('cpu', bfloat16) context around the whole training loop instead of one "
             "per forward: autocast's weight-cast cache lives until the outermost context exits, so every "
             "forward uses the bfloat16 copies of the weights made at step 0 while the fp32 weights move"),
    "F06_gpt1_ffn_residual_from_input": dict(
        model="gpt1", twin="H3_gpt1_bf16_adamax", bug="ffn_residual_from_input", expected="residual",
        what="H3 whose post-LN blocks add the feed-forward output to the block input, ln_2(x + mlp(n)), where "
             "ln_2(n + mlp(n)) was meant: the attention sub-layer's output n reaches the stream only through the "
             "MLP"),
    "F07_olmoe_memkv_causal_upper_left": dict(
        model="olmoe", twin="H4_olmoe_memory_kv", bug="memkv_causal_upper_left", expected="mask",
        what="H4 whose attention over [memory; text] calls sdpa with is_causal=True: with 16 more keys than "
             "queries, torch aligns the causal mask to the top left, so byte i attends to the memory and to the "
             "bytes 0 .. i - 16, never to its own last 16 bytes (itself included)"),
    "F08_olmoe_adam_sqrt_inplace_state": dict(
        model="olmoe", twin="H4_olmoe_memory_kv", bug="adam_sqrt_inplace_state", expected="optimizer",
        what="H4 whose AdamW builds its denominator with in-place ops on the state, denom = "
             "v.sqrt_().div_(sqrt(1 - beta2^t)).add_(eps): the second moment is overwritten by sqrt(v_hat) + eps "
             "at every step, so v drifts towards beta2 (~1) instead of tracking g^2, and the update shrinks to "
             "about lr x m, momentum SGD at Adam's lr"),
    "F09_gpt1_rdrop_kl_probs": dict(
        model="gpt1", twin="H5_gpt1_rdrop", bug="rdrop_kl_probs", expected="loss_function",
        what="H5 whose R-Drop term hands F.kl_div the probabilities softmax(p) as its input, which kl_div takes "
             "as log-probabilities: the term becomes sum q (log q - p), rewarding high entropy and agreement of "
             "the two passes' probabilities instead of measuring their KL"),
    "F10_gpt1_reseed_every_step": dict(
        model="gpt1", twin="H5_gpt1_rdrop", bug="reseed_every_step", expected="training_loop",
        what="H5 whose loop calls torch.manual_seed(seed) at the top of every step ('reproducible dropout'; "
             "seed + step was meant): the sampler, drawing from the global RNG, returns the same 16 windows at "
             "every step, and the dropout draws the same masks"),
}

assert all(r["expected"] in VOCABULARY for r in RUNS.values() if r["bug"])
assert all(RUNS[r["twin"]]["bug"] is None for r in RUNS.values() if r["bug"])
assert max(sum(r["twin"] == h for r in RUNS.values()) for h in RUNS) <= 2
