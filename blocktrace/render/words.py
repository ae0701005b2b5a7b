"""Words the tool shows, in English and in the tutorials' Chinese (seed 000: 步骤 / 操作 / 输出shape)."""

from __future__ import annotations

from blocktrace.vocab import Lang
from blocktrace.wiring import DEEPNORM, PARALLEL, PARALLEL_ONE_NORM, POST, PRE, REORDERED, SANDWICH, Wiring

HEADINGS = {
    Lang.EN: {
        "index": "#",
        "step": "step",
        "operation": "operation",
        "shape": "shape",
        "attention": "attention",
        "entropy": "entropy per head (uniform over the keys each query sees = {uniform:.4f})",
        "max_weight": "max weight {weight}, max pre-softmax logit {logit}",
        "heatmap": "head {head} (rows: queries, columns: keys{batch_note})",
        "heatmap_batch": ", first sequence",
        "heatmap_skipped": "heatmap skipped: {tokens} tokens > {limit} (use --json or --save for the weights)",
        "heatmap_marks": "marks: the weight's tenth, {marks} (none below 0.1)",
        "values": "first {n} values of token {index} ({label}) at every step",
        "why": "what each step does",
        "tokens": "tokens",
        "input": "input x",
        "weights": "weights: {path} ({family}), layer {layer} of 0–{last}",
        "measured": "measured", "norms": "norms",
        "causal": "causal (changing the last token moved no earlier output)",
        "not_causal": "NOT causal (changing the last token moved earlier outputs by {leak})",
        "inside_attn": "inside attn: q and k {stages}", "then": ", then ", "projected": "as projected",
        "inside_conv": "inside attn, a short convolution: B, C and x as projected, B ⊙ x, then its convolution",
        "inside_delta": "inside attn, a gated delta net: q, k and v after the convolution, z, β and the decay, the "
                        "rule's output, then the gated norm",
        "inside_mamba": "inside attn, Mamba-2: the gate z, x, B and C after the convolution, the step Δ and the decay, "
                        "the scan's output, then the gated norm",
        "after_qk_norm": "after QK-norm", "after_rope": "after the rotary embedding",
        "inside_ffn": "inside ffn: the router, then the experts it chose", "note": "note",
    },
    Lang.ZH: {
        "index": "步骤",
        "step": "名称",
        "operation": "操作",
        "shape": "输出shape",
        "attention": "注意力",
        "entropy": "每个头的熵（对每个 query 可见的 key 均匀分布 = {uniform:.4f}）",
        "max_weight": "最大权重 {weight}，softmax 前最大 logit {logit}",
        "heatmap": "第 {head} 个头（行：query，列：key{batch_note}）",
        "heatmap_batch": "，第一条序列",
        "heatmap_skipped": "热力图已省略：{tokens} 个 token > {limit}（用 --json 或 --save 查看权重）",
        "heatmap_marks": "标记：权重所在的十分位，{marks}（低于 0.1 不标）",
        "values": "第 {index} 个 token（{label}）在每一步的前 {n} 个数值",
        "why": "每一步在做什么",
        "tokens": "tokens",
        "input": "输入 x",
        "weights": "权重：{path}（{family}），第 {layer} 层，共 0–{last} 层",
        "measured": "实测", "norms": "归一化",
        "causal": "因果（改变最后一个 token 没有改动任何更早的输出）",
        "not_causal": "不是因果的（改变最后一个 token 使更早的输出变化了 {leak}）",
        "inside_attn": "attn 内部：q 和 k {stages}", "then": "，然后", "projected": "投影之后",
        "inside_conv": "attn 内部（短卷积）：投影出的 B、C、x，B ⊙ x，然后卷积",
        "inside_delta": "attn 内部（门控 delta 层）：卷积之后的 q、k、v，z、β 与衰减，delta 输出，然后门控归一化",
        "inside_mamba": "attn 内部（Mamba-2）：门 z，卷积之后的 x、B、C，步长 Δ 与衰减，scan 输出，然后门控归一化",
        "after_qk_norm": "QK-norm 之后", "after_rope": "旋转位置编码之后",
        "inside_ffn": "ffn 内部：router，然后是它选中的 experts", "note": "注",
    },
}

COMPARE_WORDS = {
    Lang.EN: {
        "title": "blocktrace compare: {axis} {a} vs {b}, same parameters, same input",
        "common": "common", "weights": "weights: {path} ({family}), from layer {layer} of 0–{last}",
        "step": "step", "operation": "operation", "output": "output", "differs": "what differs",
        "why": "what each step does, under {value}",
        "columns": "‖x‖²/d: the stream's mean square after the layer (rms²); attn share and ffn share: the variance "
                   "of the sublayer's update over that of the sum it is added into (Var[update] / Var[residual1], "
                   "Var[update] / Var[residual2]) — how much of the stream each sublayer writes; max|Δ| and cosine: "
                   "the two variants' outputs of the layer, compared",
    },
    Lang.ZH: {
        "title": "blocktrace compare：{axis} {a} 对比 {b}，相同的参数，相同的输入",
        "common": "共同设置", "weights": "权重：{path}（{family}），从第 {layer} 层起，共 0–{last} 层",
        "step": "名称", "operation": "操作", "output": "输出", "differs": "不同之处",
        "why": "{value} 连线下每一步在做什么",
        "columns": "‖x‖²/d：该层之后残差流的均方（rms²）；attn share 与 ffn share：子层的更新的方差除以它被加入的和的方差"
                   "（Var[更新] / Var[residual1]、Var[更新] / Var[residual2]），即每个子层写入残差流的比重；max|Δ| 与 "
                   "cosine：比较两种变体在该层的输出",
    },
}
# compare's what-differs notes in Chinese: diagnose.compare.Phrasing's fields besides the sentences below.
NOTES_ZH = {"stop": "。", "join": "，", "output": "输出的 rms：{sizes}；两个输出的最大 |Δ| 为 {diff}（余弦相似度 {cosine}）。",
            "unshared": "{value} 有另一方没有的参数，由种子随机生成：{names}。"}
# What each compared value does, said in Chinese (the English is each wiring's summary and diagnose/compare.py's).
VALUE_SENTENCES_ZH = {
    "pre": "pre：归一化在每个子层之前，残差流携带 x 加上每个未归一化的更新，所以它的尺度会逐个 block 增长",
    "post": "post：归一化在每次残差相加之后，所以每个子层之后残差流都被重新缩放到每个 token 单位大小",
    "deepnorm": "deepnorm：post-LN，每次相加前残差流乘以 α（初始化时 FFN、V、O 权重乘以 β），所以每个更新相对残差流都很小",
    "sandwich": "sandwich（Peri-LN，Gemma-2）：每个子层前后各有一个归一化；残差流携带 x 加上归一化后的更新，"
                "每个更新大小有界，而残差流本身从不被重新缩放",
    "reordered": "reordered（OLMo-2）：归一化在每个子层之后、相加之前；子层读取原始残差流，残差流携带 x 加上归一化后的更新",
    "layernorm": "layernorm 减去每个 token 的均值并除以标准差，再乘 gain、加 shift",
    "rmsnorm": "rmsnorm 只把每个 token 除以它的均方根并乘 gain：不去中心化，没有 shift",
    "gelu": "gelu：Linear，精确 GELU 0.5·x·(1 + erf(x/√2))，Linear",
    "gelu_tanh": "gelu_tanh：Linear，GPT-2 的 tanh 近似 GELU，Linear",
    "relu": "relu：Linear，max(0, x)，Linear：负的预激活值恰好为 0",
    "relu2": "relu2：Linear，max(0, x)²，Linear：Primer 的平方 ReLU，负的预激活值恰好为 0",
    "swiglu": "swiglu：down(silu(gate(x)) · up(x))：带第三个矩阵（gate）的门控单元",
    "geglu": "geglu：down(gelu_tanh(gate(x)) · up(x))：Gemma 的门控单元",
    "geglu_exact": "geglu_exact：down(gelu(gate(x)) · up(x))，用精确 GELU：hidden_activation 为 gelu 的 Gemma-2",
    "xielu": "xielu：Linear，xIELU（大于 0 时 αp·x² + β·x，小于 0 时是一支学到的负分支），Linear：Apertus 的",
    "off": "qk_norm 关闭：q·k 随 q 和 k 的大小增长，注意力 logit 也会随之增长",
    "on": "qk_norm 打开：每个头的 q 和 k 在 RoPE 之前做 RMS 归一化（Qwen3，Dehghani et al. 2023），"
          "注意力 logit 因而受归一化的 gain 约束",
}

_PRE = {
    Lang.EN: {
        "norm1": "Normalises each token's vector before attention; only attention sees x_norm1, "
        "the residual keeps the raw x.",
        "attn": "Each token takes a softmax(q·k/√d_head)-weighted mix of the value vectors of the "
        "tokens it may see (itself and earlier ones when causal).",
        "residual1": "Adds the original x, not x_norm1: whatever attention does, x gets through.",
        "norm2": "Normalises x1 again, so the FFN sees a stable scale.",
        "ffn": "Works on every token on its own: widen to d_ff, nonlinearity, project back to d_model.",
        "residual2": "Adds x1, not x_norm2: the second residual path; the output keeps the input's shape.",
    },
    Lang.ZH: {
        "norm1": "在进入注意力之前对每个 token 的向量做归一化；只有注意力看到 x_norm1，残差用的是原始 x。",
        "attn": "每个 token 按 softmax(q·k/√d_head) 的权重，把它能看到的 token（因果时是自己和之前的）"
        "的 value 向量加权混合。",
        "residual1": "残差：加的是原始 x，不是 x_norm1；注意力学成什么样，x 的信息都不会丢。",
        "norm2": "再对 x1 做一次归一化，让 FFN 看到稳定的尺度。",
        "ffn": "逐 token 单独加工：升维到 d_ff，非线性，再降回 d_model。",
        "residual2": "残差：加的是 x1，不是 x_norm2；输出形状和输入完全一致。",
    },
}

_POST = {
    Lang.EN: {
        "attn": "Attention reads the raw stream x directly (no norm in front of it).",
        "residual1": "Adds the attention output to x; the sum is not yet normalised.",
        "norm1": "Normalises the sum x + attn_out: the residual stream itself is rescaled here.",
        "ffn": "Works on every token of x1 on its own: widen to d_ff, nonlinearity, project back.",
        "residual2": "Adds the FFN output to x1.",
        "norm2": "Normalises the sum again: each token of the block output has mean 0 and std 1 before the "
        "learned gain and shift (which set its final scale).",
    },
    Lang.ZH: {
        "attn": "注意力直接读取原始的 x（前面没有归一化）。",
        "residual1": "把注意力输出加到 x 上；这个和还没有归一化。",
        "norm1": "对 x + attn_out 做归一化：残差流本身在这里被重新缩放。",
        "ffn": "对 x1 的每个 token 单独加工：升维到 d_ff，非线性，再降回。",
        "residual2": "把 FFN 输出加到 x1 上。",
        "norm2": "再对和做归一化：在可学习的 gain 和 shift 之前，block 输出的每个 token 均值为 0、标准差为 1"
        "（最终尺度由 gain 决定）。",
    },
}


_DEEPNORM = {
    Lang.EN: {
        "residual1": "Adds the attention output to α·x (α = (2N)^¼ > 1): the stream outweighs the update.",
        "residual2": "Adds the FFN output to α·x1, the stream again scaled up by α.",
    },
    Lang.ZH: {
        "residual1": "把注意力输出加到 α·x 上（α = (2N)^¼ > 1）：残差流的分量大于更新。",
        "residual2": "把 FFN 输出加到 α·x1 上，残差流同样先乘以 α。",
    },
}


_SANDWICH = {
    Lang.EN: {
        "post_attn_norm": "Normalises attn_out itself: the update the stream receives has a bounded size.",
        "residual1": "Adds attn_normed to the raw x: the stream itself is never rescaled.",
        "post_ffn_norm": "Normalises ffn_out before it is added, as post_attn_norm did for attention.",
        "residual2": "Adds ffn_normed to x1: the second residual path; the output keeps the input's shape.",
    },
    Lang.ZH: {
        "post_attn_norm": "对 attn_out 本身做归一化：残差流收到的更新大小有界。",
        "residual1": "把 attn_normed 加到原始的 x 上：残差流本身从不被重新缩放。",
        "post_ffn_norm": "在相加之前对 ffn_out 做归一化，和 post_attn_norm 对注意力做的一样。",
        "residual2": "把 ffn_normed 加到 x1 上：第二条残差路径；输出形状和输入一致。",
    },
}

_REORDERED = {
    Lang.EN: {
        "attn": "Attention reads the raw stream x directly (the norm comes after it, not before).",
        "norm1": "Normalises attn_out, attention's output: the update is rescaled, never the stream.",
        "residual1": "Adds attn_normed to the raw x: the stream itself is never normalised.",
        "ffn": "Works on every token of x1, the raw stream, on its own: widen to d_ff, nonlinearity, project back.",
        "norm2": "Normalises ffn_out before it is added, as norm1 did for attention.",
        "residual2": "Adds ffn_normed to x1: the second residual path; the output keeps the input's shape.",
    },
    Lang.ZH: {
        "attn": "注意力直接读取原始的 x（归一化在它之后，不在之前）。",
        "norm1": "对 attn_out（注意力的输出）做归一化：被缩放的是更新，不是残差流。",
        "residual1": "把 attn_normed 加到原始的 x 上：残差流本身从不被归一化。",
        "ffn": "对 x1（原始的残差流）的每个 token 单独加工：升维到 d_ff，非线性，再降回。",
        "norm2": "在相加之前对 ffn_out 做归一化，和 norm1 对注意力做的一样。",
        "residual2": "把 ffn_normed 加到 x1 上：第二条残差路径；输出形状和输入一致。",
    },
}
_PARALLEL = {
    Lang.EN: {
        "norm2": "Normalises x, the block's input, not x1: the FFN runs beside attention, not after it.",
        "residual2": "Adds ffn_out to x1, so the output is x + attn_out + ffn_out: both updates from the same x.",
    },
    Lang.ZH: {
        "norm2": "对 block 的输入 x（不是 x1）做归一化：FFN 与注意力并行，而不是在它之后。",
        "residual2": "把 ffn_out 加到 x1 上，输出是 x + attn_out + ffn_out：两个更新都来自同一个 x。",
    },
}


_PARALLEL_ONE_NORM = {
    Lang.EN: {
        "ffn": "Works on every token of x_norm1, the same normalised input attention reads: the FFN runs beside "
               "attention, not after it.",
        "residual2": "Adds ffn_out to x1, so the output is x + attn_out + ffn_out: both updates from the same x_norm1.",
    },
    Lang.ZH: {
        "ffn": "对 x_norm1（注意力读取的同一个归一化输入）的每个 token 单独加工：FFN 与注意力并行，而不是在它之后。",
        "residual2": "把 ffn_out 加到 x1 上，输出是 x + attn_out + ffn_out：两个更新都来自同一个 x_norm1。",
    },
}


def _over(base: dict, changes: dict) -> dict:
    return {lang: {**base[lang], **changes[lang]} for lang in base}


# Every wiring's sentences, by its name (blocktrace.wiring): DeepNorm is Post-LN with α-scaled adds, sandwich and a
# parallel residual are Pre-LN with a few steps told differently.
SENTENCES = {PRE.name: _PRE, PARALLEL.name: _over(_PRE, _PARALLEL),
             PARALLEL_ONE_NORM.name: _over(_PRE, _PARALLEL_ONE_NORM), POST.name: _POST,
             DEEPNORM.name: _over(_POST, _DEEPNORM), SANDWICH.name: _over(_PRE, _SANDWICH), REORDERED.name: _REORDERED}


def explanation(lang: Lang, wiring: Wiring, step: str) -> str:
    """One sentence on what `step` does under this wiring."""
    return SENTENCES[wiring.name][lang][step]


def explained_steps(lang: Lang, wiring: Wiring) -> dict[str, str]:
    """Every step this wiring's sentences cover, with its sentence."""
    return dict(SENTENCES[wiring.name][lang])
