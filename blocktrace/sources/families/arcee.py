"""Arcee (Arcee AI's AFM, 2025; HF's Arcee): Llama's attention and norms with an ungated MLP, down(ReLU²(up(x)))
(`mlp.up_proj`, `mlp.down_proj`: no gate_proj; hidden_act relu2 by default, Primer's squared ReLU), `attention_bias`
on the four attention projections, `mlp_bias` on the two MLP ones."""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import UNGATED_ACTIVATIONS, linear, rmsnorm_shape
from blocktrace.sources.families.llama import Llama
from blocktrace.vocab import FFNKind, Norm


class Arcee(Llama):
    # Llama keys, ungated ReLU² MLP
    name, hf_classes = "arcee", ("ArceeDecoderLayer",)
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "relu2"}  # ArceeConfig's
    activations = UNGATED_ACTIVATIONS  # ArceeMLP applies any of HF's activations between its two matrices

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, ffn_in="mlp.up_proj.weight", ffn=FFNKind.RELU2)

    @staticmethod
    def mlp(read, c) -> dict:
        d, f = c.d_model, c.d_ff
        return {**linear(read, "mlp.up_proj", "ffn.fc", f, d, c.bias),
                **linear(read, "mlp.down_proj", "ffn.proj", d, f, c.bias)}

    def check(self, config):
        if not config.ffn.plain or config.norm is not Norm.RMSNORM or config.sandwich:
            raise UsageError(f"{self.name} weights need --norm rmsnorm, an ungated --ffn (relu2, relu, gelu or "
                             "gelu_tanh) and no sandwich norms")
