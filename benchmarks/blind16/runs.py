"""The runs of the sixteenth blind benchmark: pure data (no torch), shared by train.py and report.py.

Each failing run names its healthy twin (the same recipe without the bug) and the one cause from
the diagnosis vocabulary that the bug's mechanism belongs to. See README.md for the why and the
public source of every bug.
"""

VOCABULARY = (
    "learning_rate", "initialisation", "warmup", "architecture", "precision", "mask", "residual",
    "norm", "data", "routing", "optimizer", "gradient_flow", "weights", "training_loop",
    "loss_function", "unknown",
)

# name -> spec. "model": dsv2 | scratch. "bug": None for healthy runs.
RUNS = {
    # ---------------------------------------------------------------- healthy
    "H1_dsv2_amsgrad": dict(
        model="dsv2", twin=None, bug=None, expected=None,
        what="HF DeepseekV2ForCausalLM from a config (DeepSeek-V2's Multi-head Latent Attention: keys and values "
             "through a rank-64 latent with its own RMSNorm, a decoupled 16-dim RoPE part of each query/key head; "
             "3 dense layers, d 128, 4 heads, SwiGLU 384, untied head), torch AdamW with "
             "amsgrad=True (Reddi et al. 2018), lr 2e-3 (0.9, 0.95, wd 0.1 on matrices), warm-up 10 then cosine "
             "to 10%, clip 1.0"),
    "H2_dsv2_sophia": dict(
        model="dsv2", twin=None, bug=None, expected=None,
        what="HF DeepseekV2ForCausalLM as H1, trained with Sophia-G written out (Liu et al. 2023): momentum 0.965, a "
             "diagonal Gauss-Newton-Bartlett Hessian estimate from labels sampled from the model's own output "
             "every 10 steps (EMA 0.99), update -lr * sign(m) * min(|m| / (rho * bs * h), 1), rho 0.04, "
             "lr 1e-3, wd 0.1, warm-up 10 then cosine to 10%, clip 1.0"),
    "H3_scratch_seqlen_warmup": dict(
        model="scratch", twin=None, bug=None, expected=None,
        what="a hand-written GPT in the style of rasbt/LLMs-from-scratch (its own causal multi-head attention "
             "computing softmax(QK^T / sqrt(d_head)), LayerNorm, GELU feed-forward, learned positions; 3 layers, "
             "d 128, 4 heads), trained with a sequence-length warm-up (Li et al. 2022): windows cut to 16 bytes "
             "at step 0, growing linearly to 128 by step 60; AdamW 2e-3 (0.9, 0.95), warm-up 10 + cosine, clip 1"),
    "H4_scratch_vaswani_noam": dict(
        model="scratch", twin=None, bug=None, expected=None,
        what="the hand-written GPT with Vaswani et al. 2017's input side: fixed sinusoidal positions, the token "
             "embedding (init N(0, d^-1/2), fairseq's) multiplied by sqrt(d), the output layer tied to it; Adam "
             "(0.9, 0.98, eps 1e-9) with the 'Noam' schedule lr = 0.1 * d^-0.5 * min(s^-0.5, s * w^-1.5), w 16; "
             "clip 1"),
    "H5_scratch_primer": dict(
        model="scratch", twin=None, bug=None, expected=None,
        what="the hand-written GPT with Primer's two changes (So et al. 2021): squared-ReLU feed-forward and a "
             "causal depthwise convolution (width 3) on every head's queries, keys and values (Multi-DConv-Head "
             "Attention); AdamW 2e-3 (0.9, 0.95, wd 0.1), warm-up 10 + cosine, clip 1"),
    # ---------------------------------------------------------------- failing
    "F01_dsv2_lambdalr_absolute_lr": dict(
        model="dsv2", twin="H1_dsv2_amsgrad", bug="lambdalr_absolute_lr", expected="learning_rate",
        what="H1 with its schedule's lambda returning the learning rate (2e-3 x warm-up x cosine) where LambdaLR "
             "wants a factor of the optimizer's lr: the lr is 2e-3 x 2e-3 = 4e-6 at its peak"),
    "F02_dsv2_bytes_repr_corpus": dict(
        model="dsv2", twin="H1_dsv2_amsgrad", bug="bytes_repr_corpus", expected="data",
        what="H1 trained on a corpus built as ''.join(str(path.read_bytes()) ...).encode(): every file's repr "
             "(b'...' with \\n, \\t, \\\\ and \\' escapes) instead of its text; the held-out text is real bytes"),
    "F03_dsv2_sophia_clamp_min": dict(
        model="dsv2", twin="H2_dsv2_sophia", bug="sophia_clamp_min", expected="optimizer",
        what="H2 with Sophia's clip written ratio.clamp(1) for clamp(None, 1): torch.clamp's first positional "
             "argument is min, so the ratio |m| / (rho bs h) is bounded below by 1 instead of above"),
    "F04_dsv2_newline_document_mask": dict(
        model="dsv2", twin="H2_dsv2_sophia", bug="newline_document_mask", expected="mask",
        what="H2 with a packing-style document mask (4D boolean attention_mask: causal, and only within the same "
             "document), its document boundary at eos_id, which in this byte tokenizer is the newline: every "
             "line is a document, so no byte attends to anything before the start of its own line"),
    "F05_scratch_norm_gain_zero": dict(
        model="scratch", twin="H3_scratch_seqlen_warmup", bug="norm_gain_zero", expected="norm",
        what="H3 with every LayerNorm's gain initialised to zeros (Gemma's (1 + weight) convention) while the "
             "norm multiplies by the gain itself (Llama's convention): every norm's output starts at zero"),
    "F06_scratch_zero_grad_before_step": dict(
        model="scratch", twin="H3_scratch_seqlen_warmup", bug="zero_grad_before_step", expected="training_loop",
        what="H3 with the loop's order backward, clip, zero_grad, step: the gradients are cleared before the "
             "optimizer reads them, so AdamW only applies its weight decay"),
    "F07_scratch_embedding_std1_scaled": dict(
        model="scratch", twin="H4_scratch_vaswani_noam", bug="embedding_std1_scaled", expected="initialisation",
        what="H4 with the token embedding left at nn.Embedding's default N(0, 1) init while it is still multiplied "
             "by sqrt(d) (and tied to the output layer): embeddings of std 11, logits of std ~11 at step 0"),
    "F08_scratch_noam_warmup_never_ends": dict(
        model="scratch", twin="H4_scratch_vaswani_noam", bug="noam_exponent_sign", expected="warmup",
        what="H4 with the Noam schedule typed min(s^0.5, s * w^-1.5) (s ** 0.5 for s ** -0.5): the warm-up "
             "branch stays the minimum until s = w^3 = 4096, so the warm-up never ends: the lr passes H4's peak "
             "(2.2e-3 at step 16) and keeps rising linearly, to 2.2e-2 at step 160"),
    "F09_scratch_nograd_lower_blocks": dict(
        model="scratch", twin="H5_scratch_primer", bug="nograd_lower_blocks", expected="gradient_flow",
        what="H5 with the embedding and all blocks but the last run under torch.no_grad() ('to save memory', "
             "a misreading of activation checkpointing): only the last block and the head get gradients"),
    "F10_scratch_space_pad_labels_masked": dict(
        model="scratch", twin="H5_scratch_primer", bug="space_pad_labels_masked", expected="loss_function",
        what="H5 with the loss's labels set to -100 wherever the target equals the pad id (masking by value, not "
             "by position), and the pad id a space, ord(' '), the character-level habit of padding with blanks: "
             "the model is never trained to predict a space (a fifth of Python source's bytes)"),
}
