"""OLMo-3: OLMo-2's block (norms after the sublayers, QK-norm over all heads) with sliding-window
layers — three sliding to one global by default, as Olmo3Config computes `layer_types` — and
RoPE parameters of its own per layer type (transformers 5's `rope_parameters` keyed by
`full_attention` / `sliding_attention`; an older file's `rope_scaling` applies to the global layers)."""

from __future__ import annotations

from blocktrace.errors import WeightsError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import rope_fields
from blocktrace.sources.families.gemma import FULL
from blocktrace.sources.families.llama import SLIDING
from blocktrace.sources.families.olmo2 import OLMo2

LAYER_TYPE_KEYS = (FULL, SLIDING)


class OLMo3(OLMo2):
    # OLMo-2's block, sliding layers, RoPE per layer type
    name, hf_classes = "olmo3", ("Olmo3DecoderLayer",)
    defaults = {**OLMo2.defaults, "sliding_window": 4096, "rope_theta": 500_000.0}

    def config_fields(self, config):
        return {**super().config_fields(config), **self.rope(config, FULL)}

    def sliding_by_default(self, config: ConfigFile, layer: int) -> bool:
        return (layer + 1) % 4 != 0  # three sliding, the fourth global

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        kind = SLIDING if self.sliding(config, layer) else FULL
        window = self.setting(config, "sliding_window", "integer") if kind == SLIDING else None
        return {"sliding_window": window, **self.rope(config, kind)}

    def rope(self, config: ConfigFile, layer_type: str) -> dict:
        """As Olmo3Config reads them: rope_parameters[layer_type], the global layers' updated by an older
        rope_scaling; a theta missing there is 500000 — for the sliding layers even where a top-level rope_theta
        says otherwise (HF gives that to the global layers only): that case is refused, not guessed."""
        nested = config.mapping("rope_parameters")
        stray = sorted(set(nested.data) - set(LAYER_TYPE_KEYS))
        if stray:
            raise WeightsError(f"{config.path}: rope_parameters must be keyed by layer type ({', '.join(LAYER_TYPE_KEYS)})"
                               f" for olmo3, not hold {', '.join(stray)}: HF's Olmo3Config ignores them")
        parameters = nested.mapping(layer_type) if layer_type in nested.data else ConfigFile(config.path, {})
        if layer_type == FULL and config.raw("rope_scaling") is not None:
            parameters = ConfigFile(config.path, {**parameters.data, **config.mapping("rope_scaling").data})
        top = config.number("rope_theta", None, positive=True)
        if layer_type == SLIDING and "rope_theta" not in parameters.data and top not in (None, self.defaults["rope_theta"]):
            raise WeightsError(f"{config.path}: rope_theta {top:g} at the top level reaches only the global layers in "
                               f"HF's Olmo3Config (its sliding layers turn at {self.defaults['rope_theta']:g}): give "
                               "rope_parameters per layer type")
        fields = rope_fields(config, parameters=parameters, default_theta=self.defaults["rope_theta"])
        if layer_type == SLIDING and "rope_theta" not in parameters.data:
            fields["rope_theta"] = self.defaults["rope_theta"]
        return fields

    def top_level_defaults(self, config):
        return [key for key in self.defaults if key != "rope_theta"]  # HF nests it in rope_parameters
