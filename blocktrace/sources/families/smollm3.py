"""SmolLM3 (Llama's keys and block) with NoPE layers: `no_rope_layers` holds 1 for a layer that
rotates q and k and 0 for one that does not (default: every fourth layer without RoPE,
`no_rope_layer_interval`); a sliding window only where `layer_types` marks a layer sliding —
by default the NoPE layers, when use_sliding_window is on — as SmolLM3Config computes them."""

from __future__ import annotations

from blocktrace.errors import WeightsError
from blocktrace.sources.families.base import NOPE_FIELDS, rotates
from blocktrace.sources.families.llama import SLIDING, Llama



class SmolLM3(Llama):
    # Llama keys, NoPE layers
    name, hf_classes = "smollm3", ("SmolLM3DecoderLayer",)
    defaults = {**Llama.defaults, "no_rope_layer_interval": 4}
    tie_default = True

    def rotates(self, config, layer: int) -> bool:
        return rotates(config, layer, self.setting(config, "no_rope_layer_interval", "integer"))

    def sliding(self, config, layer: int) -> bool:
        types = config.layer_types(config.integer("num_hidden_layers"))
        use = config.boolean("use_sliding_window", False)
        if types is None:
            return use and config.integer("sliding_window") is not None and not self.rotates(config, layer)
        if types[layer] == SLIDING and not use:  # HF's eager/sdpa masks slide, its flash attention does not
            raise WeightsError(f"{config.path}: layer_types marks layer {layer} sliding but use_sliding_window is "
                               "false: HF's attention implementations disagree on such a layer, so blocktrace "
                               "refuses it")
        return types[layer] == SLIDING

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        window = config.integer("sliding_window") if self.sliding(config, layer) else None
        return {"sliding_window": window, **({} if self.rotates(config, layer) else NOPE_FIELDS)}

    def notes(self, config):
        notes = super().notes(config)
        if config is not None:
            unrotated = [k for k in range(config.integer("num_hidden_layers")) if not self.rotates(config, k)]
            notes.append(f"layers without RoPE (NoPE): {', '.join(map(str, unrotated)) or 'none'}")
        return notes

    def top_level_defaults(self, config):
        return [key for key in self.defaults if key != "no_rope_layer_interval" or "no_rope_layers" not in config]
