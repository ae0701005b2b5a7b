"""Ministral (Mistral AI, 2024; HF's Ministral, as Ministral-8B-Instruct-2410): Mistral's keys and block, with a
sliding window chosen layer by layer — `layer_types` marks each layer sliding_attention or full_attention, and
without them every layer slides when `sliding_window` is set (4096 by default, MistralConfig's), as MinistralConfig
computes them. A layer marked sliding with no window attends to every earlier token, as HF's does."""

from __future__ import annotations

from blocktrace.phrases import phrase
from blocktrace.sources.families.llama import SLIDING, Mistral


class Ministral(Mistral):
    # Mistral keys, a sliding window per layer
    name, hf_classes = "ministral", ("MinistralDecoderLayer",)

    def layer_fields(self, config, layer):
        if config is None:
            return {"sliding_window": None}
        window = self.setting(config, "sliding_window", "integer")
        types = config.layer_types(config.integer("num_hidden_layers"))
        sliding = window is not None and (types is None or types[layer] == SLIDING)
        return {"sliding_window": window if sliding else None}

    def notes(self, config):
        notes = super().notes(config)
        if config is not None and "head_dim" not in config:
            notes.append(phrase("config.json has no head_dim: hidden_size / num_attention_heads assumed (HF's "
                                "MinistralConfig leaves it unset, which its attention cannot run)"))
        return notes
