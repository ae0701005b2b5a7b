"""Granite (IBM; Llama's keys and block) with four constants of its own, each a multiplier HF
applies where this file says: the embedding times `embedding_multiplier`, q·k times
`attention_multiplier` (in place of 1/√head_dim), each sublayer's output times
`residual_multiplier` before its residual add, and the logits divided by `logits_scaling` (multiplied by its inverse: a last-bit difference).
A family whose arithmetic blocktrace lacked, landed as this file: the block's residual
multiplier and the head's logit scale are BlockConfig's and HeadSpec's."""

from __future__ import annotations

from blocktrace.sources.families.base import HFLayer
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.vocab import Norm


class Granite(Llama):
    # Llama keys, embedding/attention/residual/logit multipliers
    name, hf_classes = "granite", ("GraniteDecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, hidden="mlp.act_fn", residual_multiplier="residual_multiplier")
    defaults = {**Llama.defaults, "embedding_multiplier": 1.0, "attention_multiplier": 1.0,
                "residual_multiplier": 1.0, "logits_scaling": 1.0}
    config_keys = {**Llama.config_keys, "attn_scale": "attention_multiplier",
                   "residual_multiplier": "residual_multiplier"}

    def config_fields(self, config):
        return {**super().config_fields(config),
                "attn_scale": self.setting(config, "attention_multiplier", positive=True),
                "residual_multiplier": self.setting(config, "residual_multiplier", positive=True)}

    def embed(self, checkpoint, info, ids, dtype, token_types=None):
        """HF multiplies the embedding by embedding_multiplier, a Python float, in the embedding's dtype."""
        return super().embed(checkpoint, info, ids, dtype) * self.setting(info.config, "embedding_multiplier",
                                                                         positive=True)

    def logit_scale(self, config):
        return 1.0 / self.setting(config, "logits_scaling", positive=True)
