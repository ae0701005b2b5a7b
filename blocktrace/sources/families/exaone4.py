"""EXAONE-4 (LG; Llama's keys): OLMo-2's reordered norms (x + norm(f(x)), no input_layernorm) with
QK-norm per head, and a hybrid attention: sliding-window layers that rotate q and k, and global
layers without RoPE (NoPE) whenever the model has a sliding window at all. `layer_types`, or
Exaone4Config's default — every `sliding_window_pattern`-th layer global — says which is which."""

from __future__ import annotations

from blocktrace.errors import UsageError, WeightsError
from blocktrace.config import QKNorm
from blocktrace.sources.families.base import NOPE_FIELDS
from blocktrace.sources.families.olmo2 import OLMo2
from blocktrace.vocab import Placement


class Exaone4(OLMo2):
    # reordered norms, per-head QK-norm, NoPE global layers
    name, hf_classes = "exaone4", ("Exaone4DecoderLayer",)
    defaults = {**OLMo2.defaults, "sliding_window": 4096, "sliding_window_pattern": 4}

    def config_fields(self, config):
        return {**super().config_fields(config), "qk_norm": QKNorm(), "norm_gain_float32": False}

    def sliding_by_default(self, config, layer: int) -> bool:
        if self.setting(config, "sliding_window", "integer") is None:
            return False
        pattern = config.raw("sliding_window_pattern", self.defaults["sliding_window_pattern"])
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise config.bad("sliding_window_pattern", "a positive integer when layer_types is absent (HF computes "
                             "the layer types from it)", pattern)
        return (layer + 1) % pattern != 0

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        window = self.setting(config, "sliding_window", "integer")
        if self.sliding(config, layer):
            if window is None:
                raise WeightsError(f"{config.path}: layer_types marks layer {layer} sliding but sliding_window is null")
            return {"sliding_window": window}
        return {"sliding_window": None, **(NOPE_FIELDS if window is not None else {})}

    def check(self, config):
        if config.placement is not Placement.REORDERED or config.qk_norm != QKNorm():
            raise UsageError("exaone4 weights need the reordered wiring (a norm after each sublayer) and QK-norm "
                               "per head")
