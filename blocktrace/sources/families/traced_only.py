"""HF decoder layers blocktrace traces as they are — under the Watch and `check --module` — but whose checkpoints
it does not read: no family file computes them, so `run` and `check --weights` refuse their model_type by name.
Each entry names the steps as the layer's forward takes them: a sublayer's output after any dropout the layer
applies outside it (StableLM drops out its MLP's output in the layer itself), so the residual sums hold in
training."""

from __future__ import annotations

from blocktrace.sources.families.base import HFLayer
from blocktrace.sources.families.gpt2 import GPT2_STEPS
from blocktrace.sources.families.llama import LLAMA_STEPS
from blocktrace.vocab import Norm
from blocktrace.wiring import PARALLEL_ONE_NORM, POST

GPTJ_STEPS = {"norm1": "ln_1", "attn": "attn", "ffn": "mlp"}  # x + attn(ln_1(x)) + mlp(ln_1(x))

TRACED_ONLY = {
    "OlmoDecoderLayer": HFLayer(LLAMA_STEPS, hidden="mlp.act_fn"),  # OLMo-1: LayerNorms without gain or bias
    "GPTJBlock": HFLayer(GPTJ_STEPS, PARALLEL_ONE_NORM, hidden="mlp.act"),
    "CodeGenBlock": HFLayer(GPTJ_STEPS, PARALLEL_ONE_NORM, hidden="mlp.act"),
    "StableLmDecoderLayer": HFLayer({**LLAMA_STEPS, "ffn": "dropout"}, hidden="mlp.act_fn",
                                    parallel_flag="use_parallel_residual", parallel_wiring=PARALLEL_ONE_NORM),
    "PersimmonDecoderLayer": HFLayer({**LLAMA_STEPS, "ffn": "dropout"}, hidden="mlp.act"),
    "NemotronDecoderLayer": HFLayer(LLAMA_STEPS, hidden="mlp.act_fn"),  # LayerNorm with gain 1 + w, a relu² MLP
    # GLM (the first, glm-4-9b's): Llama's steps, a fused gate_up_proj MLP, partial rotary
    "GlmDecoderLayer": HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, hidden="mlp.activation_fn"),
    # GPT-1 (OpenAIGPT): Post-LN, ln_2(n + mlp(n)) with n = ln_1(x + attn(x)); its class is called Block, as nanoGPT's
    # Pre-LN one is, with the same submodule names: known by its module and class, never by the names alone
    "transformers.models.openai.modeling_openai.Block": HFLayer(GPT2_STEPS, POST, hidden="mlp.act"),
}
# Not here: Phi-1/2 and Falcon drop out their parallel sublayers' outputs in the layer (one dropout module called
# twice; one dropout of the two outputs' sum), where no step holds what the add takes: traced as they are, their
# residual sums would not hold in training with that dropout on (tried: residual_not_added at every layer)
