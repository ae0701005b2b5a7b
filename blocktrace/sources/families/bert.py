"""BERT (`encoder.layer.{k}.…`; `bert.` prefix as task models save it): Post-LN, bidirectional,
exact GELU; old files name LayerNorm parameters gamma/beta."""

from __future__ import annotations

from torch.nn import functional as F

from blocktrace.phrases import phrase
from blocktrace.errors import UsageError
from blocktrace.sources.families.base import (Family, HeadSpec, HFLayer, LossKind, NoLoss, Reader, activation, linear,
                                              refuse_unless, size)
from blocktrace.vocab import FFNKind, Norm, Placement
from blocktrace.wiring import POST


class BERT(Family):
    name, described = "bert", "bert (encoder.layer.{k}.*, optionally bert.)"
    hf_classes = ("BertLayer",)
    hf_layer = HFLayer({"attn": "attention.output.dense", "norm1": "attention.output.LayerNorm",
                        "ffn": "output.dense", "norm2": "output.LayerNorm"}, POST,  # output.dense: W2, after W1 + GELU
                       hidden="intermediate.intermediate_act_fn", weights="attention.self")
    layers_path, marker, prefixes = "encoder.layer", "attention.self.query.weight", ("", "bert.")
    embedding_key = "embeddings.word_embeddings.weight"
    learned_positions = True
    config_keys = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "d_ff": "intermediate_size",
                   "eps": "layer_norm_eps"}

    def notes(self, config):
        if config is not None:
            return super().notes(config)
        return [*super().notes(config), "read as BERT from its key names alone: RoBERTa, XLM-R and other encoders "
                "share them but not BERT's positions (they start at padding_idx + 1); if this is one of them, its "
                "numbers here are not its own — add its config.json (blocktrace refuses those model types by name)"]

    def config_fields(self, config):
        refuse_unless(config, "position_embedding_type", ("absolute",), "uses relative positions")
        refuse_unless(config, "add_cross_attention", (False,), "adds cross-attention to an encoder")
        return {"d_model": config.integer("hidden_size"), "n_heads": config.integer("num_attention_heads"),
                "d_ff": config.integer("intermediate_size"),
                "eps": config.number("layer_norm_eps", 1e-12, positive=True),
                "ffn": activation(config, "hidden_act", "gelu"),
                "placement": Placement.POST, "causal": config.boolean("is_decoder", False)}

    def shape_fields(self, checkpoint, base):
        return {"d_model": size(checkpoint, base + "attention.self.query.weight", 0),
                "d_ff": size(checkpoint, base + "intermediate.dense.weight", 0), "eps": 1e-12, "ffn": FFNKind.GELU,
                "placement": Placement.POST, "causal": False}

    @staticmethod
    def _layer_norm(read: Reader, source: str, target: str, d: int) -> dict:
        return {f"{target}.weight": read((f"{source}.weight", f"{source}.gamma"), (d,)),
                f"{target}.bias": read((f"{source}.bias", f"{source}.beta"), (d,))}

    def parameters(self, read, c):
        d, f = c.d_model, c.d_ff
        return {**linear(read, "attention.self.query", "attn.q_proj", d, d, True),
                **linear(read, "attention.self.key", "attn.k_proj", d, d, True),
                **linear(read, "attention.self.value", "attn.v_proj", d, d, True),
                **linear(read, "attention.output.dense", "attn.out_proj", d, d, True),
                **self._layer_norm(read, "attention.output.LayerNorm", "norm1", d),
                **linear(read, "intermediate.dense", "ffn.fc", f, d, True),
                **linear(read, "output.dense", "ffn.proj", d, f, True),
                **self._layer_norm(read, "output.LayerNorm", "norm2", d)}

    token_types = True

    def embed(self, checkpoint, info, ids, dtype, token_types=None):
        """word + position + token type (0 unless given), then the embedding LayerNorm, as BertEmbeddings does."""
        base = f"{info.prefix}embeddings."
        x = (super().embed(checkpoint, info, ids, dtype)
             + checkpoint.get(base + "position_embeddings.weight", dtype, rows=slice(0, len(ids)))
             + checkpoint.get(base + "token_type_embeddings.weight", dtype, rows=token_types or [0]))
        weight = _either(checkpoint, base + "LayerNorm.weight", base + "LayerNorm.gamma", dtype)
        bias = _either(checkpoint, base + "LayerNorm.bias", base + "LayerNorm.beta", dtype)
        eps = info.config.number("layer_norm_eps", 1e-12, positive=True) if info.config else 1e-12
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    def head(self, checkpoint, info):
        """BertForMaskedLM's head (BertLMHeadModel's too, a causal decoder: is_decoder): dense, activation,
        LayerNorm, then the decoder tied to the word embeddings."""
        base = "cls.predictions."
        if base + "transform.dense.weight" not in checkpoint:
            raise NoLoss(phrase("the checkpoint holds no masked-LM head (cls.predictions, as BertForMaskedLM saves "
                                "it), so the model has no loss to compute: a BertModel checkpoint"))
        decoder = base + "decoder.weight"
        weight = decoder if decoder in checkpoint else f"{info.prefix}{self.embedding_key}"
        bias = base + "bias" if base + "bias" in checkpoint else base + "decoder.bias"
        config = info.config
        eps = config.number("layer_norm_eps", 1e-12, positive=True) if config else 1e-12
        act = activation(config, "hidden_act", "gelu") if config else FFNKind.GELU
        transform = tuple(base + f"transform.{name}" for name in ("dense.weight", "dense.bias", "LayerNorm.weight",
                                                                  "LayerNorm.bias"))
        decoder_model = bool(config and config.boolean("is_decoder", False))  # BertLMHeadModel: next-token loss
        return HeadSpec(LossKind.NEXT_TOKEN if decoder_model else LossKind.MASKED, weight, eps=eps,
                        bias=bias if bias in checkpoint else None, transform=transform, transform_activation=act,
                        tied=weight != decoder)

    def check(self, config):
        if not config.ffn.plain or config.norm is not Norm.LAYERNORM or not config.bias:
            raise UsageError("BERT weights need --norm layernorm, --bias and a non-gated --ffn")


def _either(checkpoint, key: str, old_key: str, dtype):
    return checkpoint.get(key if key in checkpoint else old_key, dtype)
