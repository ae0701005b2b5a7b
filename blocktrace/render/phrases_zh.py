"""The findings' sentences in Chinese: each template blocktrace/phrases.py's `phrase` is given in the code, with its
Chinese. A value's name in braces is the English template's (without its format, which the English applied); a
value the Chinese does not need (an English plural's "s", "is"/"are") is left out. tests/test_translate.py fails on a
template of the code missing here, on one here that no code says, and on a value here the English does not have."""

from __future__ import annotations

CAUSES_ZH = {
    "learning_rate": "学习率", "initialisation": "初始化", "warmup": "预热（warm-up）", "architecture": "模型结构",
    "precision": "数值精度", "mask": "注意力掩码", "residual": "残差连接", "norm": "归一化", "data": "数据",
    "routing": "专家路由", "optimizer": "优化器", "gradient_flow": "梯度通路", "weights": "权重",
    "training_loop": "训练循环", "loss_function": "损失函数", "unknown": "未知",
}
LEVELS_ZH = {"info": "信息", "warning": "警告", "error": "错误"}

PHRASES_ZH = {
    # --- values said inside other sentences
    "first-token": "首 token", "self": "自身", "previous-token": "前一个 token", "content": "内容",
    "counted targets": "个计入的目标", "sequences": "条序列", "positions per sequence": "个每条序列的位置",
    "learning rate": "学习率", "step": "步数", "loss scale": "损失缩放系数",
    "same": "同位", "next": "后一位", "previous": "前一位",
    " at layer{s} {layers}": "，第 {layers} 层",
    "{name}{where} ({detail})": "{name}{where}（{detail}）",
    " at learning rate {lr:g}": "，学习率为 {lr}",
    " (at this record only, so far)": "（目前只在这一条记录中）",
    " (its parameters do not require a gradient)": "（它的参数不需要梯度）",
    " (frozen on purpose or cut off from the loss: checkpoints cannot tell; a Watch can)":
        "（是有意冻结还是与损失断开：检查点无法区分，Watch 可以）",
    " (not: {names})": "（缺少：{names}）",
    "; inputs finite: {finite}": "；输入是否有限：{finite}",
    "; {traced} of {count} blocks ran with gradients enabled in the recorded forward":
        "；记录的前向中 {count} 个 block 里只有 {traced} 个在启用梯度时运行",
    ", and the loss is {loss:.3g} nats per token: the model copies them": "，而损失为每个 token {loss} nats：模型在照抄它们",
    " = × √{width}: multiplied by √d_head where the definition divides by it": " = × √{width}：定义要求除以 √d_head，这里却乘以了它",
    " (the definition: ÷ √{width})": "（定义：÷ √{width}）",
    "its own input token (shift 0)": "它自己的输入 token（偏移 0）",
    "the token {best:d} ahead (shift {best:d})": "往后第 {best} 个 token（偏移 {best}）",
    "shift {shift:d} {loss:.4g}": "偏移 {shift}：{loss}",
    "{relation} {share:.0%}": "{relation} {share}",

    # --- a traced step, the attention, the FFN
    "{nan} NaN, {inf} Inf{inputs}": "{nan} 个 NaN，{inf} 个 Inf{inputs}",
    "max |x| {absmax:.4g} > {FLOAT16_MAX:g} in a float16 checkpoint": "float16 检查点中 max |x| {absmax} > {FLOAT16_MAX}",
    "rescaling each token changed the output by {scale_error:.3g} (relative rms)":
        "对每个 token 重新缩放后，输出改变了 {scale_error}（相对 rms）",
    "rms of the effective gain {gain_rms:.3g}": "有效 gain 的 rms 为 {gain_rms}",
    "the norm's input gradient has |cos| {gradient_error:.3g} with a direction its output ignores":
        "norm 传回输入的梯度与其输出所忽略的方向的 |cos| 为 {gradient_error}",
    "compute the norm's statistics inside the graph (no .detach(), .data or .item() on the mean or variance), or use "
    "torch.nn.LayerNorm / torch.nn.RMSNorm":
        "在计算图内计算 norm 的统计量（均值或方差上不要用 .detach()、.data 或 .item()），或改用 "
        "torch.nn.LayerNorm / torch.nn.RMSNorm",
    "future_weight_sum={future_weight_sum:.4g} with a causal mask": "在因果掩码下 future_weight_sum={future_weight_sum}",
    "perturbing the last token moved earlier outputs by {leak:.3g} (relative rms)":
        "扰动最后一个 token 使更早的输出变化了 {leak}（相对 rms）",
    "‖output − (α·stream + update)‖ / ‖output‖ = {mismatch:.3g}": "‖输出 − (α·残差流 + 更新)‖ / ‖输出‖ = {mismatch}",
    "largest pre-softmax logit {logit:.4g}": "softmax 前最大的 logit 为 {logit}",
    "the scores are q·kᵀ × {scale:.4g}{against}": "注意力分数是 q·kᵀ × {scale}{against}",
    "{count} of {heads} heads near zero entropy (uniform {uniform_entropy:.3f}), largest logit {max_logit:.4g}":
        "{heads} 个头中有 {count} 个的熵接近 0（均匀分布为 {uniform_entropy}），最大 logit 为 {max_logit}",
    "head {head}: entropy {entropy:.3g} (uniform {uniform:.3f}), {kind} head":
        "第 {head} 个头：熵 {entropy}（均匀分布为 {uniform}），{kind}头",
    "head {head}: entropy {entropy:.4f} of uniform {uniform:.4f}": "第 {head} 个头：熵 {entropy}，均匀分布为 {uniform}",
    "{dead_fraction:.1%} of {units} hidden units never active over {tokens} tokens":
        "{units} 个隐藏单元中有 {dead_fraction} 在 {tokens} 个 token 上从未激活",
    "{flat_fraction:.1%} of hidden activations in the flat region": "{flat_fraction} 的隐藏激活落在激活函数的平坦区",
    "‖update‖/‖stream‖ = {ratio:.3g}": "‖更新‖/‖残差流‖ = {ratio}",
    "max |x| {absmax:.4g} = {ratio:.4g} × median |x|": "max |x| {absmax} = {ratio} × |x| 的中位数",
    "the median token's ‖x‖²/d grew {growth:.3g}× from layer {first} to layer {layer} (bound {bound:.3g}×; ‖x‖²/d = "
    "{size:.3g} there)":
        "中位 token 的 ‖x‖²/d 从第 {first} 层到第 {layer} 层增长了 {growth} 倍（上界 {bound} 倍；该层 ‖x‖²/d = {size}）",
    "mean ‖∂L/∂step‖ {first:.3g} at layer {first_layer} against {last:.3g} at layer {last_layer}":
        "平均 ‖∂L/∂step‖ 在第 {first_layer} 层为 {first}，在第 {last_layer} 层为 {last}",
    "non-finite gradient of a scaled loss: the loss scaler skips this step and lowers its scale":
        "缩放后损失的梯度不是有限值：损失缩放器会跳过这一步并降低缩放系数",
    "non-finite gradient": "梯度不是有限值",

    # --- the weights, the loss, the router of a checkpoint
    "the median matrix has std·√fan_in = {median:.3g}": "中位矩阵的 std·√fan_in = {median}",
    "{names}: every sampled entry holds the same value": "{names}：取样的每个元素都是同一个值",
    "{name} has {units} units for a {width}-wide stream": "{name} 只有 {units} 个单元，而 stream 的维度是 {width}",
    "give the FFN its published width: 4·d (GPT-2's n_inner=None), or 8/3·d for a SwiGLU":
        "让 FFN 用公开模型的大小：4·d（GPT-2 的 n_inner=None），SwiGLU 用 8/3·d",
    "{kind} gets a nonzero gradient at {reached} of its entries (a row of it holds {line}), here and at the record "
    "before":
        "{kind} 只有 {reached} 个元素得到非零梯度（它的一行就有 {line} 个），这条记录和上一条都是如此",
    "let the gradient reach the weights: w + (q(w) − w).detach() for a quantised or rounded weight (the "
    "straight-through estimator), no detach on it":
        "让梯度到达权重：量化或取整的权重用 w + (q(w) − w).detach()（straight-through estimator），不要对它 detach",
    "the loss is {ratio:.4g} × the smallest −log p of any token and class in the batch: no cross-entropy of these "
    "logits is that low":
        "损失是这个 batch 中任一 token、词表中任一 token 最小的 −log p 的 {ratio} 倍：这样的 logits 的交叉熵不可能这么低",
    "train a language model on F.cross_entropy(logits, targets): a softmax over the vocabulary, not a sigmoid per "
    "class":
        "用 F.cross_entropy(logits, targets) 训练语言模型：在词表上做 softmax，而不是对每个 token 各做 sigmoid",
    "dampening={dampening:g} is outside [0, 1)": "dampening={dampening} 不在 [0, 1) 内",
    "nesterov=True with dampening={dampening:g}: Nesterov momentum is defined without dampening (torch.optim.SGD "
    "refuses it)":
        "nesterov=True 而 dampening={dampening}：Nesterov 动量的定义里没有 dampening（torch.optim.SGD 不接受它）",
    "{padded} of the batch's {rows} sequences end with a run of id {id} whose targets the loss counts: right padding "
    "trained on":
        "batch 的 {rows} 个序列中有 {padded} 个以重复的 id {id} 结尾，损失计入了它们的目标：右边的 padding 被用来训练",
    "set the labels of padded positions to -100 (and pass the attention_mask), or build the batches with a collator "
    "that does":
        "把 padding 位置的 label 设为 -100（并传入 attention_mask），或用会这样做的 collator 组 batch",
    "the loss is {ratio:.4g} × the largest −log p of any token and class in the batch: no cross-entropy against a "
    "distribution reaches it":
        "损失是这个 batch 中任一 token、词表中任一 token 最大的 −log p 的 {ratio} 倍：对一个分布的交叉熵不可能达到",
    "make the loss a mean cross-entropy against targets that are distributions: one-hot labels, or soft targets that "
    "sum to 1 in every row":
        "让损失是对分布目标的平均交叉熵：one-hot 的 label，或每行之和为 1 的 soft target",
    "the {sequences} sequences trained on are {distinct} distinct ones, each seen {times:.3g} times on average":
        "训练过的 {sequences} 个序列中只有 {distinct} 个各不相同，平均每个出现了 {times} 次",
    "train on more distinct text: check how the dataset is cut into sequences (truncation keeps only each "
    "document's first window) and that the sampler draws from all of it":
        "用更多不同的文本训练：检查数据如何分成序列（只保留每个文档的开头，就只有它的第一个序列），"
        "以及取样器是否从全部数据中取样",
    "the loss's log-softmax normalises over an axis of size {size}, not the vocabulary's {vocab}":
        "损失的 log-softmax 在大小为 {size} 的维度上归一化，而不是词表的 {vocab}",
    "normalise over the vocabulary: F.log_softmax(logits, dim=-1), or F.cross_entropy on logits reshaped to [N, V]":
        "在词表维度上归一化：F.log_softmax(logits, dim=-1)，或对 reshape 成 [N, V] 的 logits 用 F.cross_entropy",
    "{names} hold NaN or Inf": "{names} 含有 NaN 或 Inf",
    "{name}: std {std:.3g}, {factor:.3g}× the median of its {count} siblings ({median:.3g})":
        "{name}：std {std}，是其他 {count} 层同一矩阵中位数（{median}）的 {factor} 倍",
    "loss {loss:.4g} against log V = {uniform:.4g} for uniform guessing": "损失 {loss}，而均匀猜测的 log V = {uniform}",
    "the model predicts {learned} better than the next token: loss {shown}": "模型预测{learned}比预测下一个 token 更准：损失 {shown}",
    "mean log Z = {log_z_mean:.4g}": "平均 log Z = {log_z_mean}",
    "eps {eps:g} is {rounded:g} in {dtype}": "eps {eps} 在 {dtype} 中变成 {rounded}",
    "load-balance loss {balance_loss:.3g} (balanced {per_token}, collapsed {experts}); the busiest expert takes "
    "{busiest:.0%} of the token slots (uniform {uniform:.0%})":
        "负载均衡损失 {balance_loss}（均衡时为 {per_token}，塌缩时为 {experts}）；最忙的 expert 占了 {busiest} 的 token 槽位"
        "（均匀时为 {uniform}）",
    "{count} of {experts} experts received no token of {tokens}: experts {experts_listed}":
        "{experts} 个 expert 中有 {count} 个在 {tokens} 个 token 中一个也没收到：expert {experts_listed}",
    "largest |router logit| {max_logit:.4g}, router z-loss {z_loss:.4g}": "最大 |router logit| 为 {max_logit}，router z-loss 为 {z_loss}",

    # --- over training: the gradients, the loss, the weights' movement
    "gradient norm {norm} while other layers get up to {largest:.3g}": "梯度范数为 {norm}，而其他层最高达 {largest}",
    "none of the {trainable} trainable blocks got a gradient, while the model's gradient norm is {norm:.3g}{enabled}":
        "{trainable} 个可训练的 block 都没有得到梯度，而模型的梯度范数为 {norm}{enabled}",
    "every trainable layer's gradient is exactly 0 at step {step}: the backward reached no parameter":
        "第 {step} 步每个可训练层的梯度都恰好为 0：反向传播没有到达任何参数",
    "loss {loss:.4g} against log V = {uniform:.4g} for uniform guessing{so_far}":
        "损失 {loss}，而均匀猜测的 log V = {uniform}{so_far}",
    "loss {loss:.4g} at step {step}, log V = {uniform:.4g}": "第 {step} 步损失为 {loss}，log V = {uniform}",
    "loss {loss:.3g} nats per token": "每个 token 的损失为 {loss} nats",
    "loss {loss:.4g}, below 0": "损失为 {loss}，小于 0",
    "every norm's output has rms {gain:.3g} = 1/√{width}": "每个归一化的输出 rms 都是 {gain} = 1/√{width}",
    "every norm's gain rms is between {low:.3g} and {high:.3g} at step 0, the loss {loss:.4g} against log V = "
    "{uniform:.4g}": "第 0 步时每个归一化的 gain 的 rms 都在 {low} 与 {high} 之间，损失 {loss}，而 log V = {uniform}",
    "loss {loss:.4g} against {mean:.4g} ± {spread:.2g} over the previous {count} records":
        "损失 {loss}，而之前 {count} 条记录为 {mean} ± {spread}",
    "this step's batch equals the batch of the record before": "这一步的 batch 与上一条记录的 batch 相同",
    "the targets passed to the model are its input ids, unshifted{copies}": "传给模型的目标就是它的输入 id，没有偏移{copies}",
    "no layer moved between steps {before} and {after}{at_lr}": "第 {before} 步到第 {after} 步之间没有任何层发生变化{at_lr}",
    "; optimizer.step() was not called between them": "；其间没有调用 optimizer.step()",
    "per-step ‖ΔW‖/‖W‖ at most {moved:.3g} against the median moving layer's {typical:.3g}{why}":
        "每步的 ‖ΔW‖/‖W‖ 最多为 {moved}，而在移动的层的中位数为 {typical}{why}",
    "the median matrix moves {median:.3g} of its norm per step{at_lr}{cut}": "中位矩阵每步只移动其范数的 {median}{at_lr}{cut}",
    ": the optimizer's step found gradients {cut:.2g} × the ones the backward left":
        "：优化器更新看到的梯度只有反向传播留下的梯度的 {cut} 倍",
    "‖ΔW‖/‖W‖ per unit of learning rate {factor:.3g}× its median over the previous {count} intervals":
        "每单位学习率的 ‖ΔW‖/‖W‖ 是之前 {count} 个区间中位数的 {factor} 倍",
    "learning rate {lr:g}, {factor:.3g}× the largest recorded before ({largest:g})":
        "学习率 {lr}，是此前记录中最大值（{largest}）的 {factor} 倍",
    "{kind}: ‖W‖ {norm:.3g}, {previous:.3g} at step {step}": "{kind}：‖W‖ 为 {norm}，第 {step} 步时为 {previous}",
    "{kind}: ‖W‖ {norm:.3g}, {factor:.2g}× its {origin:.3g} at step {step}":
        "{kind}：‖W‖ 为 {norm}，是第 {step} 步时 {origin} 的 {factor} 倍",

    # --- the optimizer and the model's settings (the audit)
    "betas={betas} has {beta:g} outside [0, 1)": "betas={betas} 中的 {beta} 不在 [0, 1) 内",
    "momentum={momentum:g} is outside [0, 1)": "momentum={momentum} 不在 [0, 1) 内",
    "betas={betas}: β1 = {beta1:g} ≥ √β2 = {root:.4g}, outside the region where Adam converges (β1 < √β2)":
        "betas={betas}：β1 = {beta1} ≥ √β2 = {root}，不在 Adam 收敛的区域内（β1 < √β2）",
    "{class_}'s param group {index} updates the model's {layers} with Muon's orthogonalised step":
        "{class_} 的第 {index} 个参数组用 Muon 的正交化更新了模型的 {layers}",
    "give Muon the hidden layers' matrices only, and the embedding, the output head, gains and biases to an AdamW group":
        "Muon 只用于隐藏层的矩阵；嵌入、输出头、gain 和偏置交给 AdamW 参数组",
    "{class_}'s step count is {count:.6g}, not a step number: step() was given a value":
        "{class_} 的步数计数是 {count}，不是步数：step() 收到了一个数值",
    "call scheduler.step() with no argument once per optimizer step; pass the metric only to "
    "ReduceLROnPlateau.step(metric)":
        "每次优化器更新后调用一次不带参数的 scheduler.step()；只有 ReduceLROnPlateau.step(metric) 才传入指标",
    "{function}: num_warmup_steps = {warmup:g} is more than the {end:g} steps of the whole schedule":
        "{function}：num_warmup_steps = {warmup}，多于整个调度的 {end} 步",
    "pass the lengths by name — num_warmup_steps (a few per cent of the run) and num_training_steps (the optimizer "
    "steps of the whole run)":
        "按参数名传入两个长度：num_warmup_steps（训练的百分之几）和 num_training_steps（整个训练的优化器步数）",
    "{function}: num_warmup_steps = {warmup:g}, a fraction of one step: the warm-up ends at step 1":
        "{function}：num_warmup_steps = {warmup}，不到一步：预热在第 1 步就结束了",
    "pass num_warmup_steps = int(ratio × the run's optimizer steps), not the ratio":
        "传入 num_warmup_steps = int(比例 × 整个训练的优化器步数)，而不是比例本身",
    "{function} is at step {step:g} of a schedule of {end:g} steps: its factor is {now:.3g} there, {at_end:.3g} at "
    "its end":
        "{function} 已到第 {step} 步，而调度只有 {end} 步：此处系数为 {now}，结束时为 {at_end}",
    "give the schedule the optimizer steps of the whole run: epochs × batches per epoch ÷ accumulation steps":
        "把整个训练的优化器步数交给调度：epoch 数 × 每个 epoch 的 batch 数 ÷ 每步的 micro-batch 个数",
    "{module}.requires_grad = True is a plain attribute: {differing} of its {parameters} parameters require no "
    "gradient":
        "{module}.requires_grad = True 只是一个普通的 Python 变量：它的 {parameters} 个参数中有 {differing} 个不需要梯度",
    "{module}.requires_grad = False is a plain attribute: {differing} of its {parameters} parameters still require a "
    "gradient":
        "{module}.requires_grad = False 只是一个普通的 Python 变量：它的 {parameters} 个参数中仍有 {differing} 个需要梯度",
    "call module.requires_grad_(flag) — the method, with the underscore — and build the optimizer after it":
        "调用 module.requires_grad_(flag)（以 _ 结尾的方法），然后再构造优化器",
    "under the autocast open at step {step}, {share:.1%} of {name}'s low-precision copy differs from the weight now: "
    "the forward computes with casts made before later optimizer steps":
        "第 {step} 步时仍处于打开的 autocast 中，{name} 的低精度副本有 {share} 与当前权重不同：前向计算用的仍是之后几次优化器步之前保存的权重转换",
    "open torch.autocast anew for each step's forward and loss (`with torch.autocast(...): loss = model(x)`), and call "
    "optimizer.step() outside it":
        "每一步的前向和损失各自打开一次 torch.autocast（`with torch.autocast(...): loss = model(x)`），并在其外调用 "
        "optimizer.step()",
    "in the optimizer step after the record at step {step}, {share:.0%} of {judged:g} sampled elements of "
    "{class_}'s exp_avg_sq left the range between their last value and the new squared gradient: no average of "
    "squared gradients does":
        "第 {step} 步记录之后的优化器步中，{class_} 的 exp_avg_sq 的 {judged} 个取样元素里有 {share} 落在其上一次的值与新的梯度平方"
        "之间的范围之外：任何梯度平方的平均都不会如此",
    "keep exp_avg_sq as β2·v + (1 − β2)·g² and build the denominator out of place (denom = (v / (1 − β2^t)).sqrt() + "
    "ε), or use torch.optim.AdamW":
        "让 exp_avg_sq 保持为 β2·v + (1 − β2)·g²，并以非原地运算构造除数（denom = (v / (1 − β2^t)).sqrt() + ε），"
        "或直接使用 torch.optim.AdamW",
    "{name} holds only zeros at step {step}: every token enters the model as the same vector":
        "{name} 在第 {step} 步全为 0：每个 token 进入模型时都是同一个向量",
    "draw the token embedding at random (N(0, 0.02) as GPT-2); zero-initialise only an untied output head":
        "随机初始化 token 嵌入（如 GPT-2 的 N(0, 0.02)）；只有与嵌入不绑定的输出头才可以初始化为 0",
    "{share:.0%} of the {tokens} tokens were sent to one expert in two of their {per_token} slots":
        "{tokens} 个 token 中有 {share} 在它们的 {per_token} 个槽位里有两个被分到同一个 expert",
    "unpack torch.topk as values, indices = torch.topk(probs, k) and dispatch by the indices (never cast the values "
    "to integers)":
        "按 values, indices = torch.topk(probs, k) 的顺序解包，并按 indices 分发（不要把 values 转成整数）",
    "changing only the padding's ids moved the text's logits by up to {leak:.3g} (relative)":
        "只改变 padding 位置的 id，正文的 logits 就变化了 {leak}（相对值）",
    "pass the attention_mask to every attention: as a boolean mask (True keeps), or as an additive one of 0 and -inf "
    "built from it, never the 0/1 mask added to the scores":
        "把 attention_mask 传给每个注意力：用 bool 掩码（True 表示保留），或由它构造的 0 与 -inf 加性掩码，"
        "不要把 0/1 掩码直接加到分数上",
    "changing one sequence of the batch moved another's logits by up to {leak:.3g} (relative)":
        "只改变 batch 中的一个序列，另一个序列的 logits 就变化了 {leak}（相对值）",
    "keep the batch axis apart: nn.MultiheadAttention(..., batch_first=True) for [B, T, E] inputs, reshapes that keep "
    "B first, norms over the last (feature) axis only":
        "让 batch 维度各自分开：[B, T, E] 输入用 nn.MultiheadAttention(..., batch_first=True)，reshape 时保持 B 在最前，"
        "归一化只在最后一维上做",
    "{kind} is exactly 0 at steps {start} and {end} under a nonzero gradient: {steps} optimizer steps left it there":
        "{kind} 在第 {start} 步和第 {end} 步都恰好为 0，梯度不为 0：{steps} 次优化器更新都没有移动它",
    "guard the trust ratio: use 1 where ‖w‖ or ‖update‖ is 0 (LAMB's reference implementations do), or do not "
    "zero-initialise the matrices such an optimizer updates":
        "trust ratio 要在 ‖w‖ 或 ‖update‖ 为 0 时取 1（LAMB 的原始实现就是这样），"
        "或者不要把这种优化器更新的矩阵初始化为 0",
    "{name}: mean {mean:.3g} against a standard deviation of {std:.3g}":
        "{name}：均值 {mean}，标准差 {std}",
    "draw weight matrices centred on 0: nn.init.normal_(std=0.02) as GPT-2, or torch.randn scaled by 1/√fan_in — not "
    "torch.rand, whose values are all positive":
        "权重矩阵要以 0 为中心初始化：像 GPT-2 那样用 nn.init.normal_(std=0.02)，或用按 1/√fan_in 缩放的 torch.randn，"
        "不要用 torch.rand（它的值全为正）",
    "{module} drops p = {dropout:g} of its activations": "{module} 丢弃了 p = {dropout} 的激活",
    "{class_}'s param group {index} has maximize=True: each step climbs the loss":
        "{class_} 的第 {index} 个参数组设置了 maximize=True：每一步都在让损失上升",
    "{class_}'s param group {index}: {detail}": "{class_} 的第 {index} 个参数组：{detail}",
    "{class_}'s param group {index} moved a weight by {move:.3g} × its learning rate in the step after the record at "
    "step {step}; its definition bounds a move by {bound:.3g} × the learning rate{when}{why}":
        "{class_} 的第 {index} 个参数组在第 {step} 步的记录之后的那一步，把一个权重移动了学习率的 {move} 倍；"
        "按其定义，一步的移动不超过学习率的 {bound} 倍{when}{why}",
    " at its step {t}": "（在它的第 {t} 步）",
    ": {lost:g} of its second moments are 0 where the first is not, rounded away":
        "：有 {lost} 个二次矩为 0 而一次矩不为 0，因精度不足而丢失",
    "at step {step} the loss's gradient at the logits is the cross-entropy's of {slope:.3g} × the logits "
    "(temperature {temperature:.3g}) on {rows} rows":
        "第 {step} 步，损失在 logits 处的梯度是 {slope} × logits 的交叉熵的梯度（T = {temperature}），在 {rows} 行上一致",
    "compute the cross-entropy with the labels on the logits as they are (temperature 1); keep a temperature for the "
    "soft, distillation term only":
        "用原样的 logits（T = 1）计算与目标的交叉熵；T ≠ 1 只用于 distillation 的那一部分",
    "at step {step} the loss weighs a token whose target is id {high} {ratio:.3g}× one whose target is id {low}, "
    "in one sequence, and tokens of the same target alike ({pairs} pairs)":
        "第 {step} 步，同一序列中，目标为 id {high} 的 token 在损失中的权重是目标为 id {low} 的 {ratio} 倍，"
        "而目标相同的 token 权重相同（{pairs} 对）",
    "at steps {steps} no row of the embedding that the batch's tokens read got a gradient, while rows they did "
    "not read did (largest {other:.3g})":
        "第 {steps} 步，batch 中的 token 读到的 embedding 行都没有梯度，而没被读到的行却有（最大 {other}）",
    "check the mask or hook on the embedding's gradient: it must keep the rows of the tokens being trained and zero "
    "only the frozen ones":
        "检查 embedding 梯度上的 mask 或 hook：它要保留要训练的 token 的行，只把冻结的行置 0",
    "at steps {steps} the embedding tied to the output head got a gradient on every row the batch read and "
    "exactly 0 on all {unread} others, though the loss normalises a softmax over the vocabulary":
        "第 {steps} 步，与输出 head 共用权重的 embedding 在 batch 读到的每一行上都有梯度，其余 {unread} 行的梯度却都恰好为 0，"
        "而损失是在整个词表上做的 softmax",
    "apply the head with the tied weight itself (the output embedding's weight or the head module), not a detached "
    "or copied tensor":
        "用共用的权重本身（输出 embedding 的权重或 head 模块）计算 head，不要用 detach 过或复制出来的 tensor",
    "{class_}'s param group {index} moved no weight by more than {move:.3g} × its learning rate in the step after "
    "the record at step {step}; its definition moves each by exactly the learning rate":
        "{class_} 的第 {index} 组参数在第 {step} 步记录之后的那次优化器更新中，没有一个权重的移动超过学习率的 {move} 倍；"
        "按其定义，每个权重都恰好移动一个学习率",
    "{class_}'s param group {index} has momentum {momentum:g}, yet in the steps after the records at steps "
    "{steps} its update was the current gradient's and weights' alone (all but {share:.2g} of it)":
        "{class_} 的第 {index} 组参数的 momentum 是 {momentum}，但在第 {steps} 步记录之后的优化器更新中，"
        "更新量只由当前的梯度和权重决定（除去的部分只占 {share}）",
    "as the optimizer steps after the records at steps {steps} began, {class_}'s first moments were {ratio:.3g}× "
    "the gradients they average (RMS); an average of gradients is never larger than the largest of them":
        "在第 {steps} 步记录之后的优化器更新开始时，{class_} 的 exp_avg（m）是它所平均的梯度的 {ratio} 倍（RMS）；"
        "梯度的平均值不会大于其中最大的梯度",
    "compute the update in a new tensor (exp_avg.mul(β1).add(g, alpha=1 − β1)), never in place on the optimizer's "
    "state, and keep the state an average of unscaled gradients":
        "在新的 tensor 里计算更新（exp_avg.mul(β1).add(g, alpha=1 − β1)），不要原地改写优化器的 state，"
        "并让 state 保持为未缩放梯度的平均",
    "{unseen} of the {tokens} tokens evaluated since the record before ({share:.1%}) have an id no training batch "
    "held; a sample of the training data would leave {expected:.2%} unseen":
        "自上次记录以来评估的 {tokens} 个 token 中，有 {unseen} 个（{share}）的 id 从未在训练 batch 中出现过；"
        "训练数据的样本只会留下 {expected} 没见过",
    "encode the training and the held-out data with the same pipeline (tokenizer, vocabulary, any preprocessing of "
    "the text), and compare a few decoded batches of each":
        "用同样的流程（tokenizer、词表、对文本的任何预处理）编码训练数据和 held-out 数据，并各解码几个 batch 对比",
    "at steps {steps} the loss's gradient at the logits pulled no logit up in any row: it trains no target":
        "第 {steps} 步，损失在 logits 处的梯度在任何一行都没有让任何 logit 变大：它不训练任何目标",
    "compute the cross-entropy on the logits as the model returned them (not detached, not a copy), and add it to "
    "the loss that backward() differentiates":
        "用模型返回的 logits 本身（不要 detach，不要复制）计算交叉熵，并把它加到 backward() 所计算的损失里",
    "keep the momentum buffer in the optimizer's state across steps (create it only where it does not exist yet), "
    "as torch.optim.SGD does":
        "让 momentum buffer 一直保留在优化器的 state 里（只在它还不存在时创建），像 torch.optim.SGD 那样",
    "apply lr·sign(β1·m + (1 − β1)·g) in a hand-written Lion (google/automl's lion_pytorch.py), or use a maintained "
    "implementation":
        "手写的 Lion 要用 lr·sign(β1·m + (1 − β1)·g)（google/automl 的 lion_pytorch.py），或改用现成的实现",
    "at step {step} the loss trains all {rows} sampled positions toward one and the same distribution of targets "
    "(its most likely token {peak:.0%}), whatever each position's own next token":
        "第 {step} 步，损失把选出的全部 {rows} 个位置都训练向同一个目标分布（其中最可能的 token 占 {peak}），"
        "与每个位置自己的下一个 token 无关",
    "index each position's log-probability with its own target: logp.gather(-1, targets.unsqueeze(-1)), or "
    "F.cross_entropy(logits.view(-1, V), targets.view(-1))":
        "用每个位置自己的目标去取它的 log 概率：logp.gather(-1, targets.unsqueeze(-1))，"
        "或 F.cross_entropy(logits.view(-1, V), targets.view(-1))",
    "; a tensor's RMS grew {growth:.3g}×": "；有一个 tensor 的 RMS 变为原来的 {growth} 倍",
    "at step {step} the loss weighs each token by its probability to the power {slope:.3g} ({rows} tokens whose "
    "probabilities span {span:.2g} nats): the tokens the model gets wrong hardly count":
        "第 {step} 步，损失按每个 token 自身概率的 {slope} 次方给它加权（{rows} 个 token，概率相差 {span} nats）："
        "模型猜错的 token 基本不计入",
    "average −log p over the tokens (F.cross_entropy on the logits), not −log of the averaged p; a robust loss for "
    "noisy labels (MAE, GCE) is for classification with wrong labels, not for a language model's text":
        "对各 token 的 −log p 取平均（在 logits 上用 F.cross_entropy），而不是对平均后的 p 取 −log；"
        "为有错的目标设计的稳健损失（MAE、GCE）用于目标有错的数据，不用于语言模型的文本",
    "train a language model on the unweighted cross-entropy (no weight= argument); set a token's targets to "
    "ignore_index to leave it out":
        "语言模型用不加权的交叉熵训练（不传 weight=）；要去掉某个 token，把它的目标设为 ignore_index",
    "{now} of {count} blocks passed their input through at step {step}; {skipped} of {forwards} blocks' "
    "forwards skipped over the records ({rate:.0%})":
        "第 {step} 步，{count} 个块中有 {now} 个把输入原样传出（被跳过）；各次记录中共 {forwards} 次块前向里有 "
        "{skipped} 次被跳过（{rate}）",
    "set the LayerDrop / stochastic-depth probability of dropping a block (0.1–0.2 is usual; check whether the "
    "setting is the probability to keep it)":
        "设置 LayerDrop / stochastic depth 丢弃一个块的概率（常用 0.1–0.2；检查这个设置是不是保留的概率）",
    "{count} parameters with a gradient are in no optimizer (first: {names}){inside}":
        "{count} 个有梯度的参数不在任何优化器里（前几个：{names}）{inside}",
    "; {partial} blocks hold some of them beside parameters an optimizer trains":
        "；其中 {partial} 个块里还有被优化器训练的参数",
    "build the param groups so that every parameter meant to train is in one (check that the groups' parameters "
    "add up to the model's); freeze the others with requires_grad_(False)":
        "构建 param groups 时让每个要训练的参数都在某一组里（检查各组参数加起来等于模型的参数）；"
        "其余的用 requires_grad_(False) 冻结",
    "optimizer.step() ran {steps} times in the {calls} steps before step {step}, at every step earlier":
        "第 {step} 步之前的 {calls} 步里 optimizer.step() 只运行了 {steps} 次，而更早时每一步都运行",
    "log when and why optimizer.step() is skipped; a spike guard compares with a running mean of recent losses (2× "
    "or more), not with the best loss so far":
        "记录 optimizer.step() 在何时、为何被跳过；判断 spike 时要与最近损失的平均值（2 倍以上）比较，而不是与之前最好的损失比较",
    "the loss's target at each position is that position's own input token, which the model sees: it learns to "
    "copy":
        "损失在每个位置上的目标就是该位置自己的输入 token，而模型看得到它：它学会的是复制",
    "the optimizer's step after step {at} found gradients of norm {stepped:.3g}, {ratio:.2g} × the loss's own "
    "({own:.3g}), under a loss scale of {scale:g}":
        "第 {at} 步之后的优化器更新看到的梯度范数为 {stepped}，是损失自身梯度（{own}）的 {ratio} 倍，损失缩放为 {scale}",
    "call scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer)":
        "在 clip_grad_norm_ 之前调用 scaler.unscale_(optimizer)，然后 scaler.step(optimizer)",
    "the softmax normalises axis {normalised} of the scores, and the product with v sums the weights over axis "
    "{summed}":
        "softmax 对分数的第 {normalised} 维归一化，而与 v 的乘积却在第 {summed} 维上对权重求和",
    "normalise the scores over the keys: F.softmax(scores, dim=-1) for scores laid out [..., queries, keys]":
        "在 key 的维度上归一化分数：分数的形状为 [..., queries, keys] 时，用 F.softmax(scores, dim=-1)",
    "the same sequence, given twice in eval mode, gave logits {moved:.3g} apart (relative)":
        "同一个序列在 eval 模式下前向两次，得到的 logits 相差 {moved}（相对值）",
    "create every layer in __init__ (so it is a module of the model, trained and saved), and pass "
    "training=self.training to functional dropout":
        "在 __init__ 中创建每一层（让它是模型的模块，被训练、被保存），并给函数式 dropout 传入 training=self.training",
    "the model": "模型",
    "{model}'s config ties its output embedding to its input embedding, and they are two tensors":
        "{model} 的配置把输出嵌入与输入嵌入绑定为同一个矩阵，而它们却是两个 tensor",
    "call model.tie_weights() after moving, wrapping or loading the model, before the optimizer is built (so that it "
    "holds the one tensor)":
        "在移动、包装或加载模型之后、创建优化器之前调用 model.tie_weights()（让优化器持有的是同一个 tensor）",
    "before step {at}'s optimizer step, the weights were again {state}: {lost} steps of training undone":
        "第 {at} 步的优化器更新之前，权重又变回了{state}：{lost} 步的训练丢失了",
    "those after step {back}'s update": "第 {back} 步更新之后的权重",
    "the ones before step 0's update (the initial weights)": "第 0 步更新之前的权重（初始权重）",
    "before step {at}'s optimizer step, a weight had changed by {change:.3g} since the step before ended, which "
    "moved weights by {move:.3g} at most":
        "第 {at} 步的优化器更新之前，一个权重自上一步结束以来改变了 {change}，而上一步对权重的移动最多为 {move}",
    "resume from the newest checkpoint (choose it by its step number, not by sorting names); if the run went back on "
    "purpose (as PaLM did around loss spikes), this is that":
        "从最新的检查点恢复（按步数选，而不是按名称的次序）；如果是有意回退（如 PaLM 在损失峰值前后所做的），那就是这个原因",
    "find what writes the model's parameters between optimizer.step() and the next forward":
        "找出在 optimizer.step() 与下一次前向之间改写模型参数的代码",
    "{lost:g} elements of {class_}'s state have exp_avg_sq = 0 and exp_avg ≠ 0":
        "{class_} 的状态中有 {lost} 个元素 exp_avg_sq = 0 而 exp_avg ≠ 0",
    "{class_}'s param group {index}: lr·weight_decay = {lr:g} × {decay:g} = {product:.3g}: each step multiplies the "
    "weights by {kept:.3g}":
        "{class_} 的第 {index} 个参数组：lr·weight_decay = {lr} × {decay} = {product}：每一步都把权重乘以 {kept}",
    "{class_}'s param group {index} has lr={lr:g} < 0: each step climbs the loss":
        "{class_} 的第 {index} 个参数组的 lr={lr} < 0：每一步都在让损失上升",
    "{kinds} {are} exactly 0 since the first record (step {step}): no gradient can move them":
        "{kinds} 从第一条记录（第 {step} 步）起就恰好为 0：没有梯度能让它们改变",
    "{optimizer} from scratch at learning rates no higher than {largest:.3g} since the first record (published "
    "pre-training peaks: 6e-5 and above)":
        "{optimizer} 从零开始训练，自第一条记录起学习率从未高于 {largest}（已发表的预训练峰值学习率都在 6e-5 及以上）",
    "use a pre-training learning rate (6e-4 for a GPT-2-sized model, 3e-4 to 1e-4 for billions of parameters) with a "
    "warm-up, and print each param group's learning rate over the first steps":
        "使用预训练的学习率（GPT-2 大小的模型用 6e-4，更大的模型用 3e-4 到 1e-4）并加上预热，"
        "再打印前几步里每个参数组的学习率",
    "first-moment rate {first:g}: its average spans {steps:.0f} steps, where published first rates stay at or below "
    "0.99 (betas swapped?)":
        "第一个 beta 为 {first}：它的平均覆盖 {steps} 步，而已发表的配方中第一个 beta 都不超过 0.99（是否把 betas 写反了?）",
    "{names}: exactly 0 in a trained checkpoint{step}": "{names}：在已训练的检查点中恰好为 0{step}",
    " (step {step})": "（第 {step} 步）",
    "reload the last checkpoint whose matrices are not zero, and find what wrote the zeros (a conversion, a merge, a "
    "pruning or loading step)":
        "重新加载最后一个矩阵不为零的检查点，并找出写入零的代码（转换、合并、裁剪或加载步骤）",
    "{names} {are} exactly 0 and {require} no gradient":
        "{names} 恰好为 0，且不需要梯度",

    # --- the loop's invariants
    "the backward of step {step} found gradients of norm {before:.3g} left from before the last optimizer step":
        "第 {step} 步的反向传播发现了范数为 {before} 的梯度，是上一次优化器更新之前留下的",
    "at step {step} backward() left gradients of norm {before:.3g}, but optimizer.step() found none":
        "第 {step} 步 backward() 留下了范数为 {before} 的梯度，但 optimizer.step() 一个也没找到",
    "the optimizer holds {share:.0%} of the trainable parameters with a gradient{missing}":
        "优化器只持有有梯度的可训练参数中的 {share}{missing}",
    "every param group's learning rate is 0 at steps {before} and {after}": "第 {before} 步和第 {after} 步每个参数组的学习率都为 0",
    "{count} dropout or batch-norm module{s} in eval mode in the forward that training backpropagated":
        "训练反向传播的前向中有 {count} 个 dropout 或 batch-norm 模块处于 eval 模式",
    "every output row is ≥ 0 and sums to 1: the model returns probabilities, not logits":
        "每一行输出都 ≥ 0 且和为 1：模型返回的是概率，不是 logits",
    "the loss's graph runs cross-entropy on the output of a softmax": "损失的计算图对 softmax 的输出做了交叉熵",
    "the loss is {ratio:.4g} × the mean cross-entropy of the model's logits: a sum over its {counts} {over}":
        "损失是模型 logits 平均交叉熵的 {ratio} 倍：是对它的 {counts} {over}求和",
    "every target of the batch is -100": "batch 中每个目标都是 -100",
    "the targets are the inputs delayed by one: each position is trained on a token it already sees":
        "目标是输入延后一位：每个位置都在学习一个它已经看得见的 token",
    "the labels are already the inputs advanced by one, and the model shifts them again: position t is trained on "
    "token t + 2": "labels 已经是输入提前一位，模型又偏移了一次：位置 t 学的是 token t + 2",
    "the targets match the inputs at no shift ({shown} of the positions)": "目标与输入在任何偏移下都对不上（{shown} 的位置）",
    "the step after the record at step {step}: g·Δw = {predicted:.3g} > 0, and its batch's loss went from "
    "{before:.4g} to {after:.4g} ({when})":
        "第 {step} 步记录之后的那一步：g·Δw = {predicted} > 0，它的 batch 损失从 {before} 变为 {after}（{when}）",
    "the optimizer's first step": "优化器的第一步",
    "at step {step}, every micro-batch's backward after the first found no gradient to add to":
        "第 {step} 步中，第一个之后的每个 micro-batch 的反向传播都没有找到可以叠加的梯度",
    "call optimizer.zero_grad() once per optimizer step — after optimizer.step() — not inside the loop over "
    "micro-batches":
        "每个优化器步只调用一次 optimizer.zero_grad()——在 optimizer.step() 之后——而不是在处理各个 micro-batch 的循环里",
    "no trainable layer had a gradient at step {step}, neither when the Watch recorded nor when the optimizer "
    "stepped: the backward reached no parameter":
        "第 {step} 步没有任何可训练层有梯度，Watch 记录时没有，优化器更新时也没有：反向传播没有到达任何参数",
    "at step {step}, {k} micro-batches each backpropagated its own mean loss undivided (d(objective)/d(loss) = 1, "
    "not 1/{k}): the step applied their sum":
        "第 {step} 步中，{k} 个 micro-batch 各自反向传播了未除以个数的平均损失（d(目标)/d(损失) = 1，而不是 1/{k}）："
        "这一步用的是它们的和",
    "divide each micro-batch's loss by the number of accumulation steps before backward() (or average the "
    "gradients before optimizer.step())":
        "在 backward() 之前把每个 micro-batch 的损失除以 micro-batch 的个数（或在 optimizer.step() 之前对梯度取平均）",
    "the backward of step {step} started at the model's loss with gradient {factor:.3g}: what backward() "
    "differentiated falls as the loss rises":
        "第 {step} 步的反向传播从模型的损失开始时梯度为 {factor}：backward() 所微分的目标随损失上升而下降",
    "{count} records in a row": "接连 {count} 条记录",
    "the step after the record at step {step}: g·Δw = {predicted:.3g} predicts a descent, and its batch's loss rose "
    "from {before:.4g} to {after:.4g} — by minus the prediction, {count} records in a row":
        "第 {step} 步记录之后的那一步：g·Δw = {predicted} 预示下降，而它的 batch 损失从 {before} 升到 {after}——"
        "恰为预测的相反数，接连 {count} 条记录",
    "rank {rank}'s weights differ from rank 0's: Σw² {value:.9g} against {reference:.9g}":
        "rank {rank} 的权重与 rank 0 不同：Σw² 为 {value}，rank 0 为 {reference}",
    "gated delta-rule layers: {layers}": "门控 delta 层：{layers}",
    "Mamba-2 layers: {layers}": "Mamba-2 层：{layers}",
    "RoPE 'dynamic' with alpha {alpha:g} read as HF reads it: a fixed base of {theta:.6g}":
        "RoPE 'dynamic'（alpha {alpha}）按 HF 的方式读取：基数定为 {theta}",
    "short-convolution layers: {layers}": "短卷积层：{layers}",
    "config.json has no head_dim: hidden_size / num_attention_heads assumed (HF's MinistralConfig leaves it unset, "
    "which its attention cannot run)":
        "config.json 没有 head_dim：按 hidden_size / num_attention_heads 计算（HF 的 MinistralConfig 不设它，其注意力因此无法运行）",
    "config.json has no layer_types and no full_attention_interval: every {interval}th layer attends, the others are "
    "delta-rule layers, as HF computes it": "config.json 没有 layer_types，也没有 full_attention_interval：每第 {interval} "
                                            "层是注意力层，其余是门控 delta 层（与 HF 相同）",
    "attn is {mixer}, a token mixer without attention weights: its causality is measured by changing later tokens":
        "attn 是 {mixer}，一个没有注意力权重的 token mixer：其因果性通过改变后面的 token 来测量",
    "causal probe not run under FSDP2: a rank had no token ids or no input embedding to probe with":
        "FSDP2 下不运行因果检测：有一个 rank 没有可用的 token id 或输入嵌入",
    "causal probe not run under FSDP2: the recording step's forward was not seen before it ran":
        "FSDP2 下不运行因果检测：记录步的前向在运行前没有被看到",
    "rank {rank}'s optimizer state differs from rank 0's: Σs² {value:.9g} against {reference:.9g}":
        "rank {rank} 的优化器状态与 rank 0 不同：Σs² 为 {value}，rank 0 为 {reference}",
    "rank {rank}'s replicated shards differ from rank {other}'s, a replica of them: Σw² {value:.9g} against "
    "{reference:.9g}": "rank {rank} 的复制分片与其副本 rank {other} 的不同：Σw² 为 {value}，rank {other} 为 {reference}",
    "after a synchronised backward, rank {rank}'s gradients differ from rank 0's: Σg² {value:.6g} against "
    "{reference:.6g}": "同步的反向传播之后，rank {rank} 的梯度与 rank 0 不同：Σg² 为 {value}，rank 0 为 {reference}",
    "all {count} ranks trained on the same batch": "全部 {count} 个 rank 用同一个 batch 训练",
    "rank {rank}'s {what} is {value:g}, rank 0's {reference:g}": "rank {rank} 的{what}为 {value}，rank 0 的为 {reference}",
    "every sequence's position_ids are one value throughout": "每条序列的 position_ids 从头到尾都是同一个值",
    "{keys} in config.json not read: Qwen3.5-MoE has no such setting (HF ignores them too)":
        "config.json 里的 {keys} 不会被读取：Qwen3.5-MoE 没有这样的设置（HF 也忽略它们）",
    "{keys} in config.json not read: HF's HunYuanMoEV1 sizes every expert and its one shared MLP by "
    "intermediate_size": "config.json 里的 {keys} 不会被读取：HF 的 HunYuanMoEV1 中每个专家和 shared MLP 的大小都由 "
                         "intermediate_size 决定",
    "mRoPE's sections read for text: every axis at the token's position, which is 1D RoPE":
        "对文本而言 mRoPE 的三组位置相同，等于一维 RoPE",
    "the forward computed in float16 and its backward was not scaled: loss scale 1":
        "前向以 float16 计算，而反向传播没有做损失缩放：loss scale 为 1",
    "a sequence's loss counts {count} targets at positions its attention mask drops":
        "一条序列的损失把注意力掩码丢弃的位置上的 {count} 个目标也算进去了",
    "the positions the mask keeps all hold one id; those it drops hold several": "掩码保留的位置都是同一个 id；它丢弃的位置却有多个不同的 id",
    "changing only later tokens moved earlier positions' logits by up to {leak:.3g} (relative; most at position "
    "{position})": "只改变后面的 token，更早位置的 logits 就变化了最多 {leak}（相对值；最大处在位置 {position}）",
    "{share:.0%} of {kind}'s 16-bit elements did not change between steps {before} and {after}":
        "第 {before} 步到第 {after} 步之间，{kind} 的 16 位元素中有 {share} 没有改变",

    "from step {since} on, each batch repeats the batch {period} steps before it: the same order again":
        "从第 {since} 步起，每个 batch 都与 {period} 步之前的 batch 相同：数据又按同样的顺序来了一遍",

    # --- advice
    "lower the peak learning rate (a tenth is a first try), keep a warm-up, and clip the gradient norm at 1.0":
        "降低峰值学习率（先试十分之一），保留预热，并把梯度范数裁剪到 1.0",
    "add a learning-rate warm-up over the first few hundred steps (Xiong et al. 2020: Post-LN needs one), and lower "
    "the peak learning rate if it still diverges":
        "在最初的几百步加入学习率预热（Xiong et al. 2020：Post-LN 需要预热）；如果仍然发散，再降低峰值学习率",
    "add a learning-rate warm-up over the first few hundred steps, and lower the peak learning rate":
        "在最初的几百步加入学习率预热，并降低峰值学习率",
    "re-initialise the weights at the usual scale — N(0, 0.02) as GPT-2 or std 1/√fan_in — with the residual output "
    "projections scaled by 1/√(2·layers)":
        "按常用尺度重新初始化权重——像 GPT-2 那样用 N(0, 0.02)，或 std 1/√fan_in——残差输出投影再乘以 1/√(2·层数)",
    "the FFN's units are dead: use GELU or SwiGLU instead of ReLU, or a lower learning rate and FFN biases "
    "initialised at 0": "FFN 的单元已经死亡：用 GELU 或 SwiGLU 代替 ReLU，或者降低学习率并把 FFN 偏置初始化为 0",
    "most FFN units never activate: check the FFN biases and the scale of the FFN input; lower the learning rate":
        "大多数 FFN 单元从不激活：检查 FFN 的偏置和 FFN 输入的尺度；降低学习率",
    "train in bfloat16 or float32, or keep float16 with a loss scaler (torch.amp.GradScaler) and float32 norms and "
    "softmax": "用 bfloat16 或 float32 训练；或者保留 float16，但加上损失缩放器（torch.amp.GradScaler），并让归一化和 softmax 用 float32",
    "apply the causal mask to the attention scores before the softmax (is_causal=True, or an additive mask of -inf "
    "above the diagonal)": "在 softmax 之前对注意力分数施加因果掩码（is_causal=True，或在对角线以上加 -inf 的加性掩码）",
    "add the un-normalised stream: x = x + sublayer(norm(x)) in Pre-LN, not norm(x) + sublayer(...)":
        "加上未归一化的残差流：Pre-LN 中是 x = x + sublayer(norm(x))，而不是 norm(x) + sublayer(...)",
    "make the norm normalise each token over its last dimension, and keep it in the forward path":
        "让归一化在最后一个维度上对每个 token 做归一化，并把它留在前向路径中",
    "check the data pipeline: what reaches the model (NaN or Inf, a batch repeated, targets equal to the inputs "
    "instead of shifted by one)": "检查数据管道：到达模型的是什么（NaN 或 Inf、重复的 batch、目标等于输入而不是偏移一位）",
    "check the optimizer: that optimizer.step() runs after backward(), that it holds every parameter of the model, "
    "its eps and betas (Adam: 1e-8, 0.9/0.95–0.999) and its weight decay (≈ 0.1, off the norms' gains)":
        "检查优化器：optimizer.step() 是否在 backward() 之后运行，是否持有模型的每个参数，它的 eps 和 betas"
        "（Adam：1e-8，0.9/0.95–0.999）以及 weight decay（≈ 0.1，不作用于归一化的 gain）",
    "find where the layer is cut from the loss: a .detach() or torch.no_grad() in the forward, requires_grad=False "
    "set by mistake, or a hook that zeroes its gradient":
        "找出这一层在哪里与损失断开：前向中的 .detach() 或 torch.no_grad()、误设的 requires_grad=False，或把梯度清零的 hook",
    "find the code that writes the weights outside the optimizer (loading, surgery, a hook, an in-place op on a "
    "parameter) and reload the last good checkpoint":
        "找出在优化器之外写入权重的代码（加载、手术式修改、hook、对参数的原地操作），并重新加载最后一个正常的检查点",
    "check the training loop's order and modes: optimizer.zero_grad() once per optimizer step (before the next "
    "backward), optimizer.step() after backward() and before zero_grad(), model.train() after every evaluation":
        "检查训练循环的顺序和模式：每次优化器更新调用一次 optimizer.zero_grad()（在下一次 backward 之前），"
        "optimizer.step() 在 backward() 之后、zero_grad() 之前，每次评估之后调用 model.train()",
    "compute the loss as F.cross_entropy(logits, targets) on raw logits (no softmax before it), averaged over the "
    "counted tokens (reduction='mean')":
        "用原始 logits 计算损失 F.cross_entropy(logits, targets)（之前不做 softmax），并对计入的 token 取平均（reduction='mean'）",
    "the evidence says that training fails but points at no mechanism: compare the run with a healthy one "
    "(blocktrace track RUN --against HEALTHY), and watch it with optimizer= given so that the loop's invariants are "
    "checked": "证据表明训练失败了，但没有指向任何机制：把这次运行与一次健康的运行对比"
               "（blocktrace track RUN --against HEALTHY），并在 Watch 中传入 optimizer=，以便检查训练循环的不变量",
    "train the router with the load-balance loss (Switch/Mixtral: router_aux_loss_coef 0.01 × E·Σ f·P; in HF set "
    "output_router_logits) and the router z-loss (ST-MoE: 1e-3 × mean logsumexp²), give the router a lower learning "
    "rate, and keep its logits and softmax in float32":
        "用负载均衡损失训练 router（Switch/Mixtral：router_aux_loss_coef 0.01 × E·Σ f·P；在 HF 中设置 "
        "output_router_logits）并加上 router z-loss（ST-MoE：1e-3 × mean logsumexp²），给 router 更低的学习率，"
        "并让它的 logits 和 softmax 保持 float32",
    "divide the scores by √d_head: att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1)) (or multiply by 1 / "
    "math.sqrt(...)); F.scaled_dot_product_attention does it for you":
        "把分数除以 √d_head：att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))（或乘以 1 / math.sqrt(...)）；"
        "F.scaled_dot_product_attention 会替你做这一步",
    "reload the last checkpoint whose weights are finite, and find what wrote the NaN (a diverged step saved without "
    "a check, a corrupt copy, a conversion that overflowed)":
        "重新加载最后一个权重有限的检查点，并找出写入 NaN 的原因（未经检查就保存的发散步、损坏的副本、溢出的格式转换）",
    "build the targets as the token sequence shifted by one, once: targets[t] = ids[t + 1] for a model that does "
    "not shift, labels = ids for one that does (HF)":
        "把目标构造成 token 序列偏移一位，且只偏移一次：对不自己偏移的模型用 targets[t] = ids[t + 1]，"
        "对自己偏移的模型（HF）用 labels = ids",
    "build the targets as the same token sequence shifted by one, once: targets[t] = ids[t + 1] for a model that "
    "does not shift, labels = ids for one that does (HF)":
        "把目标构造成同一个 token 序列偏移一位，且只偏移一次：对不自己偏移的模型用 targets[t] = ids[t + 1]，"
        "对自己偏移的模型（HF）用 labels = ids",
    "build the optimizer with maximize=False (the default) and keep every learning rate ≥ 0":
        "用 maximize=False（默认值）构建优化器，并让每个学习率都 ≥ 0",
    "use betas in [0, 1) with β1 < √β2 — published recipes use (0.9, 0.95), (0.9, 0.98) or (0.9, 0.999) — and a "
    "momentum below 1 (0.9 is usual)":
        "使用 [0, 1) 内且满足 β1 < √β2 的 betas——公开的训练配方用 (0.9, 0.95)、(0.9, 0.98) 或 (0.9, 0.999)——"
        "并让 momentum 小于 1（通常为 0.9）",
    "use a decoupled weight decay λ around 0.1 with learning rates around 1e-3 or below (lr·λ near 1e-4)":
        "使用 0.1 左右的解耦 weight decay λ，学习率在 1e-3 左右或更低（lr·λ 接近 1e-4）",
    "initialise weight matrices randomly (nn.init.normal_(std=0.02) as GPT-2 does, or the family's own init)":
        "随机初始化权重矩阵（像 GPT-2 那样用 nn.init.normal_(std=0.02)，或该系列模型自己的初始化）",
    "use torch.optim.AdamW, or check a hand-written optimizer's update against its formula: lr·m̂/(√v̂ + ε) with "
    "m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t)":
        "使用 torch.optim.AdamW，或按公式检查手写优化器的更新：lr·m̂/(√v̂ + ε)，其中 m̂ = m/(1 − β1^t)，"
        "v̂ = v/(1 − β2^t)",
    "keep the optimizer's state in float32 (and save it so); with 16-bit parameters, keep float32 master weights "
    "and state":
        "让优化器的状态保持 float32（保存时也如此）；参数为 16 位时，保留 float32 的主权重和状态",
    "set dropout to the recipe's rate (0.0 to 0.1 for pre-training a language model; p is the share dropped, not "
    "kept)": "把 dropout 设为训练配方的比例（预训练语言模型用 0.0 到 0.1；p 是丢弃的比例，不是保留的比例）",
    "initialise weight matrices randomly (nn.init.normal_(std=0.02) as GPT-2 does); zero only a residual branch's "
    "output projection if a recipe asks for it":
        "随机初始化权重矩阵（像 GPT-2 那样用 nn.init.normal_(std=0.02)）；只有训练配方要求时，才把残差分支的输出投影置零",
    "give the matrix its initialisation or its pretrained values, or let it train (requires_grad=True and in the "
    "optimizer); remove the module if it is meant to be absent":
        "给这个矩阵它的初始化或预训练值，或者让它参与训练（requires_grad=True 并放进优化器）；如果这个模块本就不该存在，就把它去掉",
    "let the gradient reach the blocks: torch.utils.checkpoint(..., use_reentrant=False), or an input that requires "
    "grad; no detach or no_grad around the blocks":
        "让梯度到达各个 block：用 torch.utils.checkpoint(..., use_reentrant=False)，或需要梯度的输入；"
        "不要在 block 周围用 detach 或 no_grad",
    "make the loss differentiable in the parameters where it is: no clamp, round or threshold on it (use the plain "
    "mean cross-entropy), no .detach() or .item() on the way from the logits to the loss":
        "让损失在当前参数处可微：不要对它做 clamp、取整或阈值处理（用普通的平均交叉熵），"
        "从 logits 到损失的路径上不要有 .detach() 或 .item()",
    "make the updates reach the weights: check the optimizer's learning rate, eps (Adam's 1e-8) and betas, and that "
    "every parameter is in a param group":
        "让更新到达权重：检查优化器的学习率、eps（Adam 的 1e-8）和 betas，以及每个参数都在某个参数组中",
    "fix the learning-rate schedule: warm-up and decay change it gradually (check the scheduler's state when "
    "resuming, and the units of the peak)": "修正学习率调度：预热和衰减是逐渐改变学习率的（恢复训练时检查调度器的状态，以及峰值的单位）",
    "lower the weight decay and keep it off the norms' gains and the biases (param groups with weight_decay 0)":
        "降低 weight decay，并让它不作用于归一化的 gain 和偏置（用 weight_decay 为 0 的参数组）",
    "call optimizer.zero_grad() once per optimizer step: after optimizer.step(), or before the first backward of "
    "the next step": "每次优化器更新调用一次 optimizer.zero_grad()：在 optimizer.step() 之后，或在下一步的第一次 backward 之前",
    "call optimizer.zero_grad() after optimizer.step() (or before the next backward), never between backward() and "
    "step()": "在 optimizer.step() 之后（或下一次 backward 之前）调用 optimizer.zero_grad()，绝不要在 backward() 和 step() 之间调用",
    "build the optimizer from the very model that is trained (after any re-creation, loading or wrapping that "
    "replaces its parameters), and put every trainable parameter in a param group":
        "用正在训练的那个模型构建优化器（在任何替换其参数的重新创建、加载或包装之后），并把每个可训练参数放进某个参数组",
    "print the learning rate of each param group over the first steps: the scheduler gives 0 (an integer division, "
    "a schedule that ended, a factor of 0)": "打印最初几步每个参数组的学习率：调度器给出了 0（整数除法、已经结束的调度、为 0 的系数）",
    "keep float32 master weights (torch.autocast with float32 parameters, or the optimizer's master copy) instead "
    "of updating float16/bfloat16 parameters in place":
        "保留 float32 的主权重（用 float32 参数配合 torch.autocast，或优化器的主副本），而不是原地更新 float16/bfloat16 参数",
    "call model.train() after every evaluation inside the loop (and model.eval() before it)":
        "在循环中每次评估之后调用 model.train()（评估之前调用 model.eval()）",
    "give the loss the raw logits: drop the softmax before F.cross_entropy (or use F.nll_loss on log_softmax)":
        "把原始 logits 交给损失：去掉 F.cross_entropy 之前的 softmax（或对 log_softmax 用 F.nll_loss）",
    "give the loss the raw logits: drop the softmax between the model and F.cross_entropy (or use F.nll_loss on "
    "log_softmax)": "把原始 logits 交给损失：去掉模型与 F.cross_entropy 之间的 softmax（或对 log_softmax 用 F.nll_loss）",
    "average the loss over the counted targets (reduction='mean'), or divide the learning rate by the count the sum "
    "runs over": "对计入的目标取平均损失（reduction='mean'），或把学习率除以求和所覆盖的数量",
    "set the ignore index (-100) only at padding and prompt positions: check the mask that builds the labels":
        "只在 padding 和提示词的位置设置忽略索引（-100）：检查构造 labels 的掩码",
    "make the step descend: p ← p − lr·update(g) with lr > 0 and maximize=False; check a custom optimizer's sign":
        "让更新沿下降方向：p ← p − lr·update(g)，lr > 0 且 maximize=False；检查自定义优化器的符号",
    "call backward() on the loss to minimise — the cross-entropy, the negative log-likelihood — not on its negation":
        "对要最小化的损失调用 backward()——交叉熵，即负对数似然——而不是它的相反数",
    "make every rank run the same step on the same gradients: clip, scale and step on all ranks alike, and change "
    "weights only where every rank does": "让每个 rank 用同样的梯度执行同样的一步：在所有 rank 上同样地裁剪、缩放和更新，只在每个 rank 都修改的地方修改权重",
    "let DDP average the gradients: wrap the model after moving it to its device, and keep any communication hook's "
    "all-reduce": "让 DDP 对梯度求平均：先把模型移到它的设备上再包装，并保留通信 hook 中的 all-reduce",
    "give each rank its own share: DataLoader(..., sampler=DistributedSampler(dataset)), with "
    "sampler.set_epoch(epoch) every epoch":
        "给每个 rank 分配它自己的那一份数据：DataLoader(..., sampler=DistributedSampler(dataset))，并在每个 epoch 调用 sampler.set_epoch(epoch)",
    "build and step the scheduler and the loss scaler on every rank alike, and resume every rank from one checkpoint":
        "在每个 rank 上同样地构建并步进调度器和损失缩放器，并从同一个检查点恢复每个 rank",
    "call sampler.set_epoch(epoch) at the start of every epoch (DistributedSampler shuffles by the epoch it is "
    "told), or shuffle=True in a DataLoader of one process":
        "在每个 epoch 开始时调用 sampler.set_epoch(epoch)（DistributedSampler 按它被告知的 epoch 打乱顺序），"
        "单进程的 DataLoader 则用 shuffle=True",
    "give position_ids = arange(T) per sequence (restarting at each packed document), or leave them out and let the "
    "model make them": "每条序列给 position_ids = arange(T)（在每个打包的文档处重新开始），或者不传，让模型自己生成",
    "scale the loss: scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); scaler.step(optimizer); "
    "scaler.update() — or train in bfloat16, which needs no scaler":
        "缩放损失：scaler = torch.amp.GradScaler()；scaler.scale(loss).backward()；scaler.step(optimizer)；"
        "scaler.update()——或者用 bfloat16 训练，它不需要 scaler",
    "set the labels of padded positions to -100 (labels[attention_mask == 0] = -100), or build the batches with a "
    "collator that does": "把 padding 位置的 labels 设为 -100（labels[attention_mask == 0] = -100），或用会这样做的 collator 来组 batch",
    "attention_mask = (input_ids != pad_id): 1 at the text, 0 at the padding (a mask built as == pad_id, or 1 - mask "
    "applied twice, inverts it)": "attention_mask = (input_ids != pad_id)：文本处为 1，padding 处为 0（用 == pad_id 构造的掩码，或两次 1 - mask，都会把它反转）",
    "make each position see only itself and earlier tokens: apply the causal mask to the scores (is_causal=True), "
    "and split the heads with .view(B, T, heads, d).transpose(1, 2), never .view(B, heads, T, d)":
        "让每个位置只看到自己和之前的 token：对分数施加因果掩码（is_causal=True），"
        "并用 .view(B, T, heads, d).transpose(1, 2) 拆分注意力头，不要用 .view(B, heads, T, d)",

    # --- why a model has no loss (a report's loss_note)
    "the checkpoint has no output head ({head}) and does not tie it to the embedding: no loss":
        "检查点没有输出头（{head}），也没有把它与词嵌入绑定：没有损失",
    "blocktrace does not know {family}'s output head": "blocktrace 不认识 {family} 的输出头",
    "the checkpoint holds no masked-LM head (cls.predictions, as BertForMaskedLM saves it), so the model has no loss "
    "to compute: a BertModel checkpoint":
        "检查点没有 masked-LM 头（cls.predictions，BertForMaskedLM 会保存它），所以模型没有可计算的损失：这是一个 BertModel 检查点",
    "BERT's masked-LM loss needs the [MASK] token of a tokenizer.json beside the weights":
        "BERT 的 masked-LM 损失需要权重旁边 tokenizer.json 中的 [MASK] token",
    "a block alone has no model loss: check a checkpoint (--weights) for the model's own; --grad here uses the "
    "seeded readout of Xiong et al. 2020":
        "单独一个 block 没有模型损失：要得到模型自己的损失，请检查一个检查点（--weights）；这里的 --grad 用的是 Xiong et al. 2020 的带种子读出",
    "no token to predict (one token per sequence)": "没有要预测的 token（每条序列只有一个 token）",
    # --- what a long run's report keeps of its records (training/thinning.py)
    "one record in {every} (the interval doubles whenever more than {bound} are held), with the last, and every "
    "record that raised a new finding, the first sign's and the rollback point's":
        "每 {every} 条记录取一条（保留超过 {bound} 条时间隔加倍），加上最后一条，以及每条出现新结果的记录、最早迹象所在的记录和回退点的记录",
}
