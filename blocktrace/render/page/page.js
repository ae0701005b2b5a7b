/* blocktrace's page: draws the report embedded above it (the --json document, number for number) with nothing
   fetched. Every number shown keeps the exact JSON value in data-value; hovering a cell, bar or point shows it. */
"use strict";

const REPORT = JSON.parse(document.getElementById("report").textContent);
const DEFAULTS = JSON.parse((document.getElementById("defaults") || {textContent: "null"}).textContent);
const EXPLAIN = JSON.parse((document.getElementById("explain") || {textContent: "null"}).textContent);
/* The report's sentences (findings, advice, evidence, notes), causes and levels in Chinese (render/translate.py). */
const SAID = JSON.parse((document.getElementById("words") || {textContent: "null"}).textContent);
const said = (text) => (lang === "zh" && SAID && SAID.sentences[text]) || text || "";
const causeName = (cause) => (lang === "zh" && SAID && SAID.causes[cause]) || cause;
const levelName = (level) => (lang === "zh" && SAID && SAID.levels[level]) || level;

/* What each step does (run --explain's sentences), in the page's language, under the step table. */
function explainSection(steps) {
  const said = EXPLAIN && EXPLAIN[lang];
  if (!said) return [];
  return [el("details", {class: "explain", open: ""}, el("summary", {}, w("why")),
    el("dl", {}, steps.filter((s) => said[s.name]).flatMap((s) => [el("dt", {}, s.name),
                                                                   el("dd", {"data-step": s.name}, said[s.name])])))];
}
// In English in both languages: a reader without a CJK font reads no Chinese.
const TOKENS_WITHOUT_FONT = "This browser has no font for some Chinese characters of the tokens, so they show as " +
  "boxes (the page carries the glyphs of blocktrace's own words only): install Noto Sans CJK (Debian: apt-get " +
  "install fonts-noto-cjk) and reload the page.";
const WORDS = {
  en: {
    block: "One block, step by step", stack: "A stack of blocks", model: "A checkpoint, layer by layer",
    compare: "Wirings compared on the same weights", track: "A run over training", flow: "The block's steps",
    table: "Every step", size: "The size of each step's output (rms; the residual stream is x, x1 and x2)",
    layerSize: "The residual stream's size after each layer (rms)", attention: "Attention weights",
    head: "head", queries: "rows: queries", keys: "columns: keys", causal: "causal check",
    causalOk: "no weight on a later token", causalBad: "weight on later tokens", noMatrix:
    "The attention matrices are kept for inputs up to 16 tokens; this input is longer, so only their statistics are shown.",
    findings: "Findings", none: "No findings at warning or error level.", diagnosis: "Likely cause", advice: "advice",
    layers: "Layers", loss: "loss", step: "step", operation: "operation", shape: "shape", layer: "layer",
    differs: "this layer's block differs from the model's", settings: "The block's settings",
    notDefault: "set otherwise than blocktrace's own block of this size", allSettings: "every setting",
    markNew: "a record with new findings", markFirst: "the first sign of trouble", why: "What each step does",
    logLoss: "the training log's loss (--log)", logTitle: "The training log's learning rate and gradient norm (--log)",
    logGradNorm: "the log's gradient norm",
    markParted: "where the runs first part", parted: "the runs part", neverParted: "the runs never part beyond what " +
      "a different seed explains", thisRun: "this run", reference: "the healthy run (--against)",
      partedAt: "what parts at this step", missing: "missing", againstTitle: "This run beside the healthy one",
      againstLoss: "loss, both runs",
    acrossDepth: "The residual stream across depth (‖x‖²/d after each layer, log scale)", depth: "depth",
    depthColumns: "‖x‖²/d: the stream's mean square after the layer (rms²); attn_share and ffn_share: the variance " +
      "of the sublayer's update over that of the sum it is added into (Var[update] / Var[residual1], Var[update] / " +
      "Var[residual2]) — how much of the stream each sublayer writes.",
    depthGradients: "The gradient reaching each layer's FFN (‖∂L/∂W‖ of its second matrix, log scale)",
    sweepGradients: "The last layer's FFN gradient at each depth (‖∂L/∂W‖ of its second matrix, log scale)",
    scale: "colour scale: the attention weight", scaleRoot: "colour scale: the largest weight of a cell (shaded by √weight)",
    tokensWithoutFont: TOKENS_WITHOUT_FONT,
    differences: "Where the wirings differ", output: "block output", cosine: "cosine", maxdiff: "max |Δ|",
    timeline: "Loss over training", perLayer: "Residual stream rms per layer over training",
    firstSign: "first sign", newFindings: "new findings", rollback: "roll back to", tokens: "tokens",
    thinned: "A long run: the charts and the table show a selection of its records; the findings, first sign " +
      "and rollback are judged over every record", recordsShown: "records shown",
    weights: "weights", input: "input", entropy: "entropy per head", language: "中文", flags: "flags",
    record: "record", gradients: "Gradient norm at each step's output",
    updates: "Update size per layer over training (largest ‖ΔW‖/‖W‖ of its weights, log scale)",
    largest: "largest weight", mapNote: "The input has {tokens} tokens, too many to show one by one: each cell is " +
      "the largest weight among the {cell} × {cell} query–key pairs it covers (the first sequence; rows: queries, " +
      "columns: keys, labelled by their first token's position; shaded by √weight so that small weights show).",
    mapOneNote: "The input has {tokens} tokens: each cell is one query–key weight (the first sequence; rows: " +
      "queries, columns: keys, labelled by position; shaded by √weight so that small weights show).",
  },
  zh: {
    block: "一个 block，逐步展开", stack: "多层 block 堆叠", model: "一个检查点，逐层检查",
    compare: "同一组权重上比较不同连线方式", track: "训练过程中的一次运行", flow: "block 的各个步骤",
    table: "每一步", size: "每一步输出的大小（rms；残差流是 x、x1 和 x2）", layerSize: "每一层之后残差流的大小（rms）",
    attention: "注意力权重",
    head: "头", queries: "行：query", keys: "列：key", causal: "因果检查",
    causalOk: "后面的 token 没有得到任何权重", causalBad: "后面的 token 得到了权重", noMatrix:
    "注意力矩阵只为不超过 16 个 token 的输入保存；这个输入更长，所以只显示它们的统计量。",
    findings: "检查结果", none: "没有警告或错误级别的结果。", diagnosis: "最可能的原因", advice: "建议",
    layers: "各层", loss: "损失", step: "步骤", operation: "运算", shape: "形状", layer: "层",
    differs: "这一层的 block 与模型的不同之处", settings: "block 的设置",
    notDefault: "与同样大小的 blocktrace 默认 block 不同的设置", allSettings: "全部设置",
    markNew: "出现新结果的记录", markFirst: "最早的问题迹象", why: "每一步做什么",
    logLoss: "训练日志中的损失（--log）", logTitle: "训练日志中的学习率与梯度范数（--log）", logGradNorm: "日志中的梯度范数",
    markParted: "两次运行最早分开之处", parted: "两次运行分开", neverParted: "两次运行的差别从未超出换一个随机种子所能解释的范围",
      thisRun: "本次运行", reference: "健康的运行（--against）", partedAt: "这一步分开的量", missing: "缺失",
      againstTitle: "本次运行与健康运行并列", againstLoss: "损失，两次运行",
    acrossDepth: "随深度变化的残差流（每层之后的 ‖x‖²/d，对数坐标）", depth: "深度",
    depthColumns: "‖x‖²/d：该层之后残差流的均方（rms²）；attn_share 与 ffn_share：子层的更新的方差除以它被加入的和的方差" +
      "（Var[update] / Var[residual1]，Var[update] / Var[residual2]）——每个子层向残差流写入了多少。",
    depthGradients: "到达每层 FFN 的梯度（其第二个矩阵的 ‖∂L/∂W‖，对数坐标）",
    sweepGradients: "各深度下最后一层 FFN 的梯度（其第二个矩阵的 ‖∂L/∂W‖，对数坐标）",
    scale: "颜色刻度：注意力权重", scaleRoot: "颜色刻度：格子中的最大权重（按 √权重 着色）",
    tokensWithoutFont: TOKENS_WITHOUT_FONT,
    differences: "连线方式之间的差异", output: "block 输出", cosine: "余弦相似度", maxdiff: "最大 |Δ|",
    timeline: "训练过程中的损失", perLayer: "训练过程中每层残差流的 rms",
    firstSign: "最早的迹象", newFindings: "新出现的结果", rollback: "回退到", tokens: "token",
    thinned: "较长的运行：图表和表格只显示部分记录；结果、最早的迹象和回退点都基于全部记录判断", recordsShown: "条记录已显示",
    weights: "权重", input: "输入", entropy: "每个头的熵", language: "English", flags: "标记",
    record: "记录", gradients: "每一步输出处的梯度范数",
    updates: "训练过程中每层的更新大小（各权重中最大的 ‖ΔW‖/‖W‖，对数坐标）",
    largest: "最大权重", mapNote: "输入有 {tokens} 个 token，无法逐个显示：每个格子是它覆盖的 {cell} × {cell} 个 " +
      "query–key 对中的最大权重（第一个序列；行：query，列：key，标注为其第一个 token 的位置；颜色按 √权重，小权重也看得见）。",
    mapOneNote: "输入有 {tokens} 个 token：每个格子是一个 query–key 权重（第一个序列；行：query，列：key，标注为位置；" +
      "颜色按 √权重，小权重也看得见）。",
  },
};
const STATS = ["mean", "std", "min", "max", "rms", "absmax"];
const STAT_HEADINGS = {absmax: "max|x|"};
const COLOURS = ["#2f6fdf", "#c62828", "#2e7d32", "#8e24aa", "#ef6c00", "#00838f", "#6d4c41", "#546e7a"];
let lang = document.documentElement.lang === "zh" ? "zh" : "en";
const w = (key) => WORDS[lang][key];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children.flat()) if (child) node.append(child instanceof Node ? child : String(child));
  return node;
}

function shown(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  const size = Math.abs(value);
  return size !== 0 && (size >= 1e5 || size < 1e-3) ? value.toExponential(3) : value.toFixed(4);
}

/* A step statistic as the terminal's table prints it (4 decimals: -1.987e-8 is -0.0000 there, as in the tutorial). */
function fixed(value) {
  if (value === null || value === undefined) return "—";
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(4) : String(value);
}

/* A table cell holding a JSON number: shown rounded, the exact value in data-value and in its hover text. */
function numberCell(value, name, format = shown) {
  const exact = value === null || value === undefined ? "null" : String(value);
  return el("td", {"data-value": exact, "data-name": name, "data-tip": `${name} = ${exact}`}, format(value));
}

function table(headings, rows, attrs = {}, textColumns = 2) {
  return el("table", attrs, el("thead", {}, el("tr", {}, headings.map((h, i) =>
    el("th", {class: i < textColumns ? "text" : undefined}, h)))), el("tbody", {}, rows));
}

function findingsSection(flags, diagnosis, anchor) {
  const section = [el("h2", {}, w("findings"))];
  const serious = (flags || []).filter((f) => f.level !== "info");
  if (!serious.length) section.push(el("p", {class: "note"}, w("none")));
  for (const flag of flags || []) {
    const where = [flag.layer !== null && flag.layer !== undefined ? `${w("layer")} ${flag.layer}` : null,
                   flag.step].filter(Boolean).join(" · ");
    const link = anchor(flag);
    section.push(el("div", {class: "finding", "data-flag": flag.name},
      el("span", {class: `level-${flag.level}`}, `${levelName(flag.level)} `), el("b", {}, flag.name), " ",
      where ? (link ? el("a", {href: `#${link}`}, `[${where}]`) : `[${where}]`) : "",
      ` ${flag.cause ? "(" + causeName(flag.cause) + ") " : ""}${said(flag.detail)}`));
  }
  for (const cause of diagnosis || []) {
    section.push(el("h3", {}, `${w("diagnosis")}: ${causeName(cause.cause)}`), el("p", {}, said(cause.evidence)),
                 el("p", {class: "note"}, `${w("advice")}: ${said(cause.advice)}`));
  }
  return section;
}

function stepKind(step) {
  const op = step.operation || "";
  if (step.name.startsWith("residual")) return "residual";
  if (step.name === "attn") return "attention";
  if (step.name === "ffn") return "ffn";
  if (op.includes("Norm(") || step.name.includes("norm")) return "norm";
  return "input";
}

/* A step's box as the tutorials draw it: what it computes (LayerNorm, Attention, ⊕ …) over the value it makes
   (x_norm1, attn_out, x1 …), its step name on hover with the whole formula. */
/* The block's steps as a chain of boxes, and the residual stream drawn where the wiring puts it: an arc from the box
   that made each sum's stream operand (x1 = x + attn_out: from the box that made x) over to its ⊕ — so Pre-LN's
   stream skips the norms, Post-LN's leaves from the norm after each sum (drawn by drawSkips once laid out). */
function flow(steps, prefix) {
  const parts = [el("div", {class: "box input", "data-value": "x"}, "x", el("small", {}, w("input")))];
  let previous = "x";
  for (const step of steps.filter((s) => s.name !== "x")) {
    const kind = stepKind(step), op = step.operation || "";
    const [value, formula] = op.includes(" = ") ? op.split(" = ", 2) : [step.name, ""];
    const called = (formula.match(/^([A-Za-z_][\w]*)/) || [null, step.name])[1];
    const label = kind === "residual" ? "⊕" : called.replace("MultiHeadAttention", "Attention");
    // a sum's stream operand (x1 = x + attn_out: x); a step that reads another value than the box before it
    // (a parallel block's norm2 = LayerNorm(x), after x1) branches from that value's box
    const reads = (formula.match(/^[A-Za-z_][\w]*\(\s*([\w.]+)\s*\)/) || [])[1];
    const stream = kind === "residual" ? (formula.match(/^\s*([\w.]+)\s*\+/) || [])[1]
      : reads && reads !== previous ? reads : undefined;
    previous = value;
    parts.push(el("span", {class: "arrow"}, "→"),
      el("a", {href: `#${prefix}step-${step.name}`, "data-tip": `${step.name}: ${op}`},
         el("div", {class: `box ${kind}`, "data-step": step.name, "data-value": value, "data-stream": stream},
            label, el("small", {}, value))));
  }
  return el("div", {class: "flow"}, parts);
}

/* Each flow's residual arcs, from its laid-out boxes (again on resize: boxes move when the row wraps). */
function drawSkips() {
  for (const chain of document.querySelectorAll(".flow")) {
    chain.querySelectorAll("svg.skips").forEach((old) => old.remove());
    const frame = chain.getBoundingClientRect();
    if (!frame.width) continue;  // not shown (a closed section)
    const arcs = svg("svg", {class: "skips", width: frame.width, height: frame.height, "aria-hidden": "true"});
    for (const sum of chain.querySelectorAll(".box[data-stream]")) {
      const from = [...chain.querySelectorAll(".box[data-value]")].find((b) => b.dataset.value === sum.dataset.stream);
      if (!from) continue;
      const a = from.getBoundingClientRect(), b = sum.getBoundingClientRect();
      if (Math.abs(a.top - b.top) > a.height) continue;  // on another row of a wrapped chain: no arc across rows
      const x1 = a.left + a.width / 2 - frame.left, x2 = b.left + b.width / 2 - frame.left, y = a.top - frame.top;
      arcs.append(svg("path", {class: "skip", d: `M ${x1} ${y} C ${x1} ${y - 26}, ${x2} ${y - 26}, ${x2} ${y - 2}`,
                               fill: "none", stroke: "#c2185b", "stroke-width": 2, "data-from": from.dataset.step || "x",
                               "data-to": sum.dataset.step, "marker-end": "url(#skip-head)"}));
    }
    arcs.prepend(svg("defs", {}, svg("marker", {id: "skip-head", markerWidth: 8, markerHeight: 8, refX: 4, refY: 7,
                                                orient: "0"}, svg("path", {d: "M0,0 L8,0 L4,7 z", fill: "#c2185b"}))));
    chain.append(arcs);
  }
}

function stepTable(steps, prefix) {
  const rows = steps.map((step) => el("tr", {id: `${prefix}step-${step.name}`, "data-step": step.name,
                                             class: step.flags && step.flags.length ? "flagged" : undefined},
    el("td", {class: "text"}, step.name), el("td", {class: "text"}, step.operation),
    el("td", {}, JSON.stringify(step.shape)), STATS.map((s) => numberCell(step.stats[s], s, fixed)),
    el("td", {}, `${step.stats.nan}/${step.stats.inf}`), el("td", {class: "text flags"}, (step.flags || []).join(", "))));
  return table([w("step"), w("operation"), w("shape"), ...STATS.map((s) => STAT_HEADINGS[s] || s), "nan/inf",
                w("flags")], rows, {class: "steps"});
}

/* Bars of one value per item; hovering a bar shows its exact value. */
/* Bars of one value per item, on an axis from 0 to the largest (both ticks labelled, the axis named), each bar's
   value written above it; hovering a bar shows its exact value. */
function bars(items, valueOf, labelOf, name) {
  const left = 52, bottom = 36, top = 24, height = 196;
  const width = left + Math.max(320, items.length * 60);
  const values = items.map(valueOf), most = Math.max(...values.filter(Number.isFinite), 1e-30);
  const slot = (width - left) / items.length, base = height - bottom;
  const chart = svg("svg", {width, height, role: "img", "aria-label": name});
  chart.append(svg("line", {class: "axis", x1: left, y1: top, x2: left, y2: base, stroke: "#888"}),
               svg("line", {class: "axis", x1: left, y1: base, x2: width, y2: base, stroke: "#888"}),
               svg("text", {class: "tick", x: left - 6, y: base + 4, "text-anchor": "end", "data-value": "0"}, "0"),
               svg("text", {class: "tick", x: left - 6, y: top + 4, "text-anchor": "end", "data-value": String(most)},
                   shown(most)),
               svg("text", {class: "axis-name", x: 4, y: 12}, name));
  items.forEach((item, i) => {
    const value = values[i], h = Number.isFinite(value) ? (base - top) * value / most : 0, x = left + i * slot;
    chart.append(svg("rect", {class: "hit", x: x + 8, y: base - h, width: slot - 16,
                              height: Math.max(h, 1), fill: COLOURS[0], "data-value": String(value),
                              "data-tip": `${labelOf(item)}: ${name} = ${value}`}),
                 svg("text", {class: "bar-value", x: x + slot / 2, y: base - h - 4, "text-anchor": "middle",
                              "data-value": String(value)}, shown(value)),
                 svg("text", {x: x + slot / 2, y: base + 14, "text-anchor": "middle"}, labelOf(item)));
  });
  return chart;
}

/* A weight's colour: white at 0 to blue at 1, by the weight itself or (a long input's map) by its square root. */
function weightColour(value, root) {
  const clamped = Math.min(1, Math.max(0, value)), shade = Math.round(255 * (1 - (root ? Math.sqrt(clamped) : clamped)));
  return `rgb(${shade},${shade},255)`;
}

/* The colour scale the heatmaps are drawn with: a strip from 0 to 1, ticks at each quarter of the weight. */
function colourScale(root) {
  const width = 240, left = 8, strip = 12, steps = 48;
  const chart = svg("svg", {width: width + 2 * left, height: 34, role: "img", class: "colour-scale",
                            "aria-label": w(root ? "scaleRoot" : "scale")});
  for (let i = 0; i < steps; i++) {  // the strip's colour grows evenly along it; a √ scale's ticks crowd to the left
    const along = (i + 0.5) / steps;
    chart.append(svg("rect", {x: left + i * width / steps, y: 0, width: width / steps + 0.5, height: strip,
                              fill: weightColour(root ? along * along : along, root)}));
  }
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    const x = left + (root ? Math.sqrt(tick) : tick) * width;
    chart.append(svg("line", {x1: x, x2: x, y1: strip, y2: strip + 4, stroke: "#666"}),
                 svg("text", {class: "scale-tick", x, y: strip + 16, "text-anchor": "middle",
                              "data-value": String(tick)}, String(tick)));
  }
  return el("figure", {class: "scale"}, el("figcaption", {}, w(root ? "scaleRoot" : "scale")), chart);
}

function heatmap(matrix, tokens, title) {
  const n = matrix.length, cell = Math.max(22, Math.min(48, Math.floor(360 / n))), margin = 46;
  const size = margin + n * cell;
  const chart = svg("svg", {width: size + 4, height: size + 4, role: "img", "aria-label": title, class: "heatmap"});
  matrix.forEach((row, q) => {
    chart.append(svg("text", {x: margin - 6, y: margin + q * cell + cell / 2 + 4, "text-anchor": "end"},
                     tokens[q] ?? String(q)));
    row.forEach((value, k) => {
      chart.append(svg("rect", {class: "cell", x: margin + k * cell, y: margin + q * cell, width: cell - 1,
        height: cell - 1, fill: weightColour(value, false), "data-value": String(value), "data-query": q,
        "data-key": k, "data-tip": `${tokens[q] ?? q} → ${tokens[k] ?? k}: ${value}`}));
    });
  });
  tokens.slice(0, n).forEach((token, k) => chart.append(svg("text", {x: margin + k * cell + cell / 2,
    y: margin - 8, "text-anchor": "middle"}, token)));
  return chart;
}

/* A long input's attention map: each cell the largest weight of its cell × cell block of queries and keys. */
function mapHeatmap(weightsMap, matrix, title) {
  const n = matrix.length, size = Math.max(3, Math.min(12, Math.floor(480 / n))), margin = 46;
  const span = (i) => `${i * weightsMap.cell}–${Math.min(weightsMap.tokens, (i + 1) * weightsMap.cell) - 1}`;
  const side = margin + n * size;
  const chart = svg("svg", {width: side + 4, height: side + 4, role: "img", "aria-label": title, class: "heatmap"});
  const every = Math.ceil(n / 6);
  matrix.forEach((row, q) => {
    if (q % every === 0) {
      chart.append(svg("text", {x: margin - 6, y: margin + q * size + size, "text-anchor": "end"},
                       String(q * weightsMap.cell)),
                   svg("text", {x: margin + q * size, y: margin - 8, "text-anchor": "start"},
                       String(q * weightsMap.cell)));
    }
    row.forEach((value, k) => {
      // shaded by √weight: a long input's weights are small, and a linear shade would leave them all white
      chart.append(svg("rect", {class: "cell", x: margin + k * size, y: margin + q * size, width: size,
        height: size, fill: weightColour(value, true), "data-value": String(value), "data-query": q,
        "data-key": k, "data-tip": `q ${span(q)} → k ${span(k)}: ${w("largest")} ${value}`}));
    });
  });
  return chart;
}

function attentionSection(attention, tokens, prefix = "") {
  if (!attention) return [];
  const ok = attention.future_weight_sum === 0;
  const parts = [el("h2", {}, w("attention")),
    el("p", {}, `${w("causal")}: future_weight_sum = `,
       el("b", {"data-value": String(attention.future_weight_sum), id: `${prefix}future-weight-sum`},
          Number(attention.future_weight_sum).toFixed(4)), " ",
       attention.causal ? el("span", {class: ok ? "ok" : "bad"}, ok ? `✓ ${w("causalOk")}` : `✗ ${w("causalBad")}`)
         : ""),
    el("p", {class: "note"}, `${w("entropy")}: `, (attention.entropy_per_head || []).map((e, h) =>
       el("span", {"data-value": String(e), "data-tip": `h${h} entropy = ${e}`}, `h${h}=${shown(e)} `)))];
  const matrices = attention.weights_first_sequence, pooled = attention.weights_map;
  if (!matrices && pooled) {
    parts.push(el("p", {class: "note"}, w(pooled.cell === 1 ? "mapOneNote" : "mapNote").replace(/\{cell\}/g, pooled.cell)
                                          .replace("{tokens}", pooled.tokens)),
               el("div", {class: "heads"}, pooled.heads.map((matrix, h) => el("figure", {"data-head": h},
                 el("figcaption", {}, `${w("head")} ${h}`), mapHeatmap(pooled, matrix, `${w("head")} ${h}`)))),
               colourScale(true));
    return parts;
  }
  if (!matrices) return [...parts, el("p", {class: "note"}, w("noMatrix"))];
  parts.push(el("p", {class: "note"}, `${w("queries")}, ${w("keys")}`), el("div", {class: "heads"},
    matrices.map((matrix, h) => el("figure", {"data-head": h}, el("figcaption", {}, `${w("head")} ${h}`),
                                   heatmap(matrix, tokens, `${w("head")} ${h}`)))), colourScale(false));
  return parts;
}

function tokensOf(report) {
  return Array.isArray(report.tokens) ? report.tokens.map(String) : [];
}

function blockPage(report, prefix = "") {
  const steps = report.steps || [];
  const rows = report.input ? [report.input, ...steps] : steps;  // the terminal's row 0: the input x
  const parts = [el("h2", {}, w("flow")), flow(steps, prefix), el("h2", {}, w("table")), stepTable(rows, prefix),
                 ...(prefix ? [] : explainSection(steps)),
                 el("h2", {}, w("size")), bars(steps, (s) => s.stats.rms, (s) => s.name, "rms"),
                 ...attentionSection(report.attention, tokensOf(report))];
  if (report.gradients && report.gradients.layers && report.gradients.layers[0]) {
    const norms = report.gradients.layers[0].step_grad_norms || {};
    const named = Object.keys(norms).map((name) => ({name, value: norms[name]}));
    parts.push(el("h2", {}, w("gradients")), bars(named, (s) => s.value, (s) => s.name, "‖∂L/∂step‖"));
  }
  return parts;
}

function layerRows(layers, prefix = "", linked = true) {
  const columns = ["rms", "sq_norm_per_d", "attn_share", "ffn_share", "max_logit", "min_head_entropy"]
    .filter((c) => layers.some((layer) => layer[c] !== undefined));
  const rows = layers.map((layer) => el("tr", {id: `${prefix}layer-${layer.layer}`, "data-layer": layer.layer},
    el("td", {class: "text"}, linked ? el("a", {href: `#L${layer.layer}`}, String(layer.layer)) : String(layer.layer)),
    columns.map((c) => numberCell(layer[c], c))));
  return table([w("layer"), ...columns], rows, {class: "layers"}, 1);
}

/* A closed section whose content is drawn when first opened: a checkpoint's every layer's attention maps at once
   would be hundreds of thousands of elements. */
function lazyDetails(title, content) {
  const details = el("details", {}, el("summary", {}, title));
  details.addEventListener("toggle", () => {
    if (details.open && details.children.length === 1) details.append(...content());
  });
  return details;
}

function layeredPage(report) {
  const layers = report.layers || [];
  const parts = [];
  if (report.loss !== undefined && report.loss !== null) {
    parts.push(el("p", {}, `${w("loss")}: `, el("b", {id: "loss", "data-value": String(report.loss)},
                                                  shown(report.loss)), report.loss_note ? ` (${said(report.loss_note)})` : ""));
  }
  parts.push(el("h2", {}, w("layers")), layerRows(layers),
             el("h2", {}, w("layerSize")), bars(layers, (l) => l.rms, (l) => `L${l.layer}`, "rms"));
  for (const layer of layers) {
    const differences = Object.entries(layer.config_differences || {});
    parts.push(el("h3", {id: `L${layer.layer}`}, `${w("layer")} ${layer.layer}`),
               ...(differences.length ? [el("p", {class: "differs"}, `${w("differs")}: `,
                                            differences.map(([key, value]) => `${key}=${JSON.stringify(value)}`)
                                              .join(" "))] : []),
               flow(layer.steps || [], `L${layer.layer}-`), stepTable(layer.steps || [], `L${layer.layer}-`),
               lazyDetails(w("attention"), () => attentionSection(layer.attention, tokensOf(report),
                                                                  `L${layer.layer}-`)));
  }
  return [...parts, ...findingsSection(report.flags, report.diagnosis, (flag) =>
    flag.layer === null || flag.layer === undefined ? null
      : flag.step ? `L${flag.layer}-step-${flag.step}` : `layer-${flag.layer}`)];
}

/* A variant as the docs and the flags name it (--pre-ln: Pre-LN), the document's value where it has no other name. */
const VARIANT_NAMES = {pre: "Pre-LN", post: "Post-LN", deepnorm: "DeepNorm", sandwich: "Sandwich (Peri-LN)",
  reordered: "Reordered (res-post-norm)", layernorm: "LayerNorm", rmsnorm: "RMSNorm", gelu: "GELU",
  gelu_tanh: "GELU (tanh)", relu: "ReLU", swiglu: "SwiGLU", geglu: "GeGLU"};
function variantName(value) {
  return VARIANT_NAMES[value] || String(value);
}

/* Two wirings over depth (compare --layers N): the stream's ‖x‖²/d layer by layer for both, each one's per-layer
   table, the gradient reaching each layer's FFN (--grad), and how far their outputs part, layer by layer. */
function depthComparison(report) {
  const variants = report.variants, layers = variants[0].report.layers.map((l) => l.layer);
  const over = (valueOf) => variants.map((v) => ({name: variantName(v.value), values: v.report.layers.map(valueOf)}));
  const parts = [el("h2", {}, w("acrossDepth")),
                 lines(over((l) => l.sq_norm_per_d ?? NaN), layers, [], "‖x‖²/d", true, w("layer")),
                 el("p", {class: "note"}, w("depthColumns")),
                 el("div", {class: "side"}, variants.map((v) => el("section", {"data-variant": v.value},
                   el("h3", {}, variantName(v.value)), layerRows(v.report.layers, `${v.value}-`, false))))];  // no layer sections to link to
  if (variants.every((v) => v.report.gradients && v.report.gradients.layers)) {
    const ffn = variants.map((v) => ({name: variantName(v.value), values: v.report.gradients.layers.map((g) =>
      (g.weight_grad_norms || {}).ffn_w2 ?? NaN)}));
    parts.push(el("h2", {}, w("depthGradients")), lines(ffn, layers, [], "‖∂L/∂W_ffn2‖", true, w("layer")));
  }
  const differences = (report.differences && report.differences.layers) || [];
  parts.push(el("h2", {}, w("differences")), table([w("layer"), w("maxdiff"), w("cosine")], differences.map((d) =>
    el("tr", {"data-layer": d.layer}, el("td", {class: "text"}, String(d.layer)),
       numberCell(d.max_abs_diff, "max_abs_diff"), numberCell(d.cosine, "cosine"))), {class: "depth-differences"}, 1));
  return parts;
}

/* Two wirings swept over depth (compare --layers N,M,… --grad): the loss and the last layer's FFN gradient at
   each depth — Xiong et al. 2020's picture, Post-LN's gradient flat in N, Pre-LN's falling. */
function sweepComparison(report) {
  const variants = report.variants, depths = variants[0].report.depths;
  const over = (valueOf) => variants.map((v) => ({name: variantName(v.value), values: v.report.sweep.map(valueOf)}));
  const kinds = Object.keys(variants[0].report.sweep[0].last_layer || {});
  return [el("h2", {}, w("sweepGradients")),
          lines(over((row) => row.last_layer.ffn_w2 ?? NaN), depths, [], "‖∂L/∂W_ffn2‖", true, w("depth")),
          el("div", {class: "side"}, variants.map((v) => el("section", {"data-variant": v.value},
            el("h3", {}, variantName(v.value)), table([w("depth"), w("loss"), ...kinds], v.report.sweep.map((row) =>
              el("tr", {"data-depth": row.depth}, el("td", {class: "text"}, String(row.depth)),
                 numberCell(row.loss, "loss"), kinds.map((k) => numberCell(row.last_layer[k], k)))),
              {class: "sweep"}, 1))))];
}

function comparePage(report) {
  const axis = el("p", {}, `${report.axis}: ${report.values.map(variantName).join(" · ")}`);
  const kinds = new Set(report.variants.map((v) => v.report.kind));
  if (kinds.has("sweep")) return [axis, ...sweepComparison(report)];
  if (kinds.has("stack")) return [axis, ...depthComparison(report)];
  const parts = [axis, el("div", {class: "side"},
    report.variants.map((variant) => el("section", {"data-variant": variant.value},
      el("h2", {}, variantName(variant.value)), flow(variant.report.steps || [], `${variant.value}-`),
      stepTable(variant.report.steps || [], `${variant.value}-`))))];
  const differences = report.differences;
  if (differences && differences.steps) {
    parts.push(el("h2", {}, w("differences")), table([w("step"), "", w("maxdiff"), w("cosine")], [
      ...differences.steps.map((d) => el("tr", {"data-step": d.name}, el("td", {class: "text"}, d.name),
        el("td", {class: "text"}, ""), numberCell(d.max_abs_diff, "max_abs_diff"), numberCell(d.cosine, "cosine"))),
      el("tr", {"data-step": "output"}, el("td", {class: "text"}, w("output")), el("td", {class: "text"}, ""),
         numberCell(differences.output.max_abs_diff, "max_abs_diff"), numberCell(differences.output.cosine, "cosine"))]));
  }
  return parts;
}

const MARK_WORDS = {new: "markNew", first: "markFirst", parted: "markParted"};  // what each kind of vertical mark means, in the legend

/* Lines over training steps; hovering a point shows its value; vertical marks at given steps. On a log axis
   (values over decades, as update sizes are) only positive values are drawn. */
function lines(series, steps, marks, name, log = false, xWord = w("step")) {
  const width = 720, height = 240, left = 64, right = 16, top = 12, bottom = 30;
  const drawn = (v) => Number.isFinite(v) && (!log || v > 0);
  const place = (v) => (log ? Math.log10(v) : v);
  const all = series.flatMap((s) => s.values).filter(drawn).map(place);
  const low = log ? Math.min(...all) : Math.min(...all, 0), high = log ? Math.max(...all) : Math.max(...all, 1e-30);
  const first = Math.min(...steps), last = Math.max(...steps, first + 1);
  const x = (step) => left + (width - left - right) * (step - first) / (last - first);
  const y = (value) => top + (height - top - bottom) * (1 - (place(value) - low) / ((high - low) || 1));
  const label = (v) => (log ? Number(10 ** v).toPrecision(3) : Number(v).toPrecision(4));
  const chart = svg("svg", {width, height, role: "img", "aria-label": name});
  chart.append(svg("line", {class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom}),
               svg("line", {class: "axis", x1: left, y1: top, x2: left, y2: height - bottom}),
               svg("text", {x: left - 4, y: top + 10, "text-anchor": "end"}, label(high)),
               svg("text", {x: left - 4, y: height - bottom, "text-anchor": "end"}, label(low)));
  // String: a bare 0 would be taken for no child, and step 0 went unlabelled
  steps.forEach((step) => chart.append(svg("text", {class: "step-tick", x: x(step), y: height - 10,
                                                 "text-anchor": "middle"}, String(step))));
  for (const mark of marks) {
    chart.append(svg("line", {x1: x(mark.step), x2: x(mark.step), y1: top, y2: height - bottom, stroke: mark.colour,
                              "stroke-dasharray": mark.dashed ? "4 3" : "", "data-tip": mark.text, class: "hit",
                              "stroke-width": 3, "data-mark": mark.kind}));
  }
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const points = steps.map((step, j) => [step, s.values[j]]).filter(([, v]) => drawn(v));
    chart.append(svg("polyline", {fill: "none", stroke: colour, "stroke-width": 2,
                                  points: points.map(([st, v]) => `${x(st)},${y(v)}`).join(" ")}));
    points.forEach(([step, value]) => chart.append(svg("circle", {class: "hit", cx: x(step), cy: y(value), r: 4,
      fill: colour, "data-value": String(value), "data-series": s.name, "data-step": step,
      "data-tip": `${s.name} @ ${xWord} ${step}: ${value}`})));
  });
  const kinds = [...new Map(marks.map((m) => [m.kind, m])).values()];  // each kind of mark once, as first drawn
  const legend = el("div", {class: "legend"}, series.map((s, i) =>
    el("span", {}, el("i", {style: `background:${COLOURS[i % COLOURS.length]}`}), s.name)),
    kinds.map((m) => el("span", {"data-mark": m.kind}, el("i", {class: "mark", style: `border-left: 3px ` +
      `${m.dashed ? "dashed" : "solid"} ${m.colour}; background: none`}), w(MARK_WORDS[m.kind]))));
  return el("div", {}, chart, legend);
}

/* A layer's largest ‖ΔW‖/‖W‖ over its kinds of weight at one record (none at the first: nothing before it). */
function largestUpdate(layer) {
  const ratios = Object.values((layer && layer.weights) || {}).map((w) => w.update_ratio)
    .filter((v) => typeof v === "number");
  return ratios.length ? Math.max(...ratios) : NaN;
}

/* A part of two runs in words: "L0 grad_norm — vs 0.0518 (missing)", as the terminal writes it. */
function partedText(part) {
  const where = part.layer === null || part.layer === undefined ? "" : `L${part.layer} `;
  const factor = part.factor === null || part.factor === undefined ? `(${w("missing")})` : `(${shown(part.factor)}×)`;
  return `${where}${part.quantity} ${shown(part.run)} vs ${shown(part.reference)} ${factor}`;
}

/* track --against: both runs' losses step by step, the step where they first part marked, and the table of what
   parted at each step. */
function againstSection(against) {
  const steps = against.steps.map((s) => s.step), first = against.first_parted;
  const marks = first ? [{step: first.step, colour: "#c62828", kind: "parted",
                          text: `${w("parted")} @ ${first.step}: ${partedText(first)}`}] : [];
  const curves = [{name: w("thisRun"), values: against.steps.map((s) => s.loss ?? NaN)},
                  {name: w("reference"), values: against.steps.map((s) => s.reference_loss ?? NaN)}];
  return [el("h2", {}, w("againstTitle")), lines(curves, steps, marks, w("againstLoss")),
          el("p", {id: "first-parted"}, first ? `${w("parted")}: ${w("step")} ${first.step}, ${partedText(first)}`
                                                : w("neverParted")),
          table([w("step"), w("thisRun"), w("reference"), w("partedAt")], against.steps.map((s) =>
            el("tr", {"data-step": s.step}, el("td", {class: "text"}, String(s.step)), numberCell(s.loss, "loss"),
               numberCell(s.reference_loss, "reference_loss"),
               el("td", {class: "text flags"}, (s.parted || []).map(partedText).join("; ")))), {class: "against"}, 1)];
}

function trackPage(report) {
  const records = report.records || [];
  const steps = records.map((r) => r.step);
  const marks = [];
  records.forEach((r) => {
    if ((r.new_flags || []).length) {
      marks.push({step: r.step, colour: "#ef6c00", dashed: true, kind: "new",
                  text: `${w("newFindings")} @ ${r.step}: ${r.new_flags.map((f) => f.name).join(", ")}`});
    }
  });
  const first = report.first_sign;
  if (first) marks.push({step: first.step, colour: "#c62828", kind: "first",
                         text: `${w("firstSign")} @ ${first.step}: ${first.name} (${causeName(first.cause)})`});
  const layerCount = Math.max(0, ...records.map((r) => (r.layers || []).length));
  const perLayer = [...Array(layerCount).keys()].map((k) => ({name: `L${k}`, values: records.map((r) =>
    r.layers && r.layers[k] && r.layers[k].rms !== undefined ? r.layers[k].rms : NaN)}));
  const updates = [...Array(layerCount).keys()].map((k) => ({name: `L${k}`, values: records.map((r) =>
    largestUpdate(r.layers && r.layers[k]))}));
  const logged = records.some((r) => r.log);  // --log: the training log's own numbers beside each record
  const fromLog = (key) => records.map((r) => (r.log && typeof r.log[key] === "number" ? r.log[key] : NaN));
  const losses = [{name: w("loss"), values: records.map((r) => r.loss ?? NaN)},
                  ...(logged ? [{name: w("logLoss"), values: fromLog("loss")}] : [])];
  const thinning = report.thinning;  // a long run's report keeps a selection of its records: said, never hidden
  const parts = [...(thinning ? [el("p", {id: "thinning", class: "note"}, `${w("thinned")} ` +
                                    `(${thinning.records_kept} / ${thinning.records_read} ${w("recordsShown")}: ` +
                                    `${said(thinning.how)}).`)] : []),
                 ...(report.against ? againstSection(report.against) : []), el("h2", {}, w("timeline")),
                 lines(losses, steps, marks, w("loss")),
                 ...(logged ? [el("h2", {}, w("logTitle")),
                               lines([{name: "lr", values: fromLog("lr")}], steps, marks, "lr", true),
                               lines([{name: w("logGradNorm"), values: fromLog("grad_norm")}], steps, marks,
                                     w("logGradNorm"), true)] : []),
                 el("h2", {}, w("perLayer")), lines(perLayer, steps, marks, "rms"),
                 el("h2", {}, w("updates")), lines(updates, steps, marks, "‖ΔW‖/‖W‖", true)];
  if (first) {
    parts.push(el("p", {id: "first-sign"}, el("b", {class: "level-error"}, `${w("firstSign")}: `),
                  `${w("step")} ${first.step}, ${first.name} (${causeName(first.cause)}) ${said(first.detail)}`));
  }
  if (report.rollback) {
    const where = report.rollback.path ? ` (${report.rollback.path})` : "";
    parts.push(el("p", {id: "rollback"}, `${w("rollback")}: ${w("step")} ${report.rollback.step}${where}`));
  }
  parts.push(table([w("step"), w("newFindings"), w("loss")], records.map((r) => el("tr", {"data-step": r.step},
    el("td", {class: "text"}, String(r.step)), el("td", {class: "text"}, (r.new_flags || []).map((f) => f.name)
      .join(", ")), numberCell(r.loss, "loss"))), {class: "records"}));
  const last = records[records.length - 1];
  return [...parts, ...findingsSection(last ? last.flags : [], last ? last.diagnosis : [], () => null)];
}

const PAGES = {block: blockPage, stack: layeredPage, model: layeredPage, compare: comparePage, track: trackPage};

/* The document's config (key=value, as the table's header writes them), closed: first the settings that differ
   from blocktrace's defaults for a block of its size (DEFAULTS), then every setting that is set, behind a toggle. */
function settingsSection(config) {
  if (!config || typeof config !== "object") return [];
  const said = ([key, value]) => `${key}=${typeof value === "object" ? JSON.stringify(value) : value}`;
  const set = Object.entries(config).filter(([, value]) => value !== null && value !== undefined);
  const all = el("p", {class: "all"}, set.map(said).join(" "));
  if (!DEFAULTS) return [el("details", {class: "settings"}, el("summary", {}, w("settings")), all)];
  const differing = Object.entries(config).filter(([key, value]) =>
    JSON.stringify(value === undefined ? null : value) !== JSON.stringify(key in DEFAULTS ? DEFAULTS[key] : null));
  return [el("details", {class: "settings"}, el("summary", {}, w("settings")),
    el("p", {class: "not-default"}, `${w("notDefault")}: `, differing.map(said).join(" ") || "—"),
    el("details", {class: "all-settings"}, el("summary", {}, `${w("allSettings")} (${set.length})`), all))];
}

function kindOf(report) {
  return report.kind || (Array.isArray(report.records) ? "track" : "block");
}

/* Whether this browser has no font for Chinese: "猫" drawn exactly as a code point no font has (the box a missing
   glyph becomes). The page says so, rather than show its Chinese as boxes without a word. */
/* Whether some of `text`'s characters draw as the browser's missing-glyph box in the page's fonts. */
function drawnAsBoxes(text) {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 40;
  const context = canvas.getContext("2d");
  if (!context) return false;
  const drawn = (character) => {
    context.clearRect(0, 0, 40, 40);
    context.font = `32px ${getComputedStyle(document.body).fontFamily}`;
    context.fillText(character, 2, 32);
    return Array.from(context.getImageData(0, 0, 40, 40).data).join(",");
  };
  const box = drawn("\u{10FFFD}");
  return Array.from(text).slice(0, 64).some((character) => drawn(character) === box);
}

/* The page carries the glyphs of blocktrace's own Chinese words (render/html.py): only its tokens' characters outside
   them need the reader's own fonts. */
function fontNote() {
  const uncovered = (SAID && SAID.font && SAID.font.uncovered) || "";
  return uncovered && drawnAsBoxes(uncovered) ? [el("p", {class: "font-note", role: "note"}, w("tokensWithoutFont"))] : [];
}

function render() {
  document.documentElement.lang = lang;
  const kind = kindOf(REPORT);
  const header = document.getElementById("top");
  const toggle = el("button", {type: "button", id: "language"}, w("language"));
  toggle.addEventListener("click", () => { lang = lang === "en" ? "zh" : "en"; render(); });
  const weights = REPORT.weights && typeof REPORT.weights === "object" ? REPORT.weights.path : REPORT.weights;
  const facts = [weights ? `${w("weights")}: ${weights}` : null,
                 Array.isArray(REPORT.tokens) ? `${w("tokens")}: ${REPORT.tokens.join(" ")}` : null].filter(Boolean);
  header.replaceChildren(el("h1", {}, `blocktrace · ${w(kind)}`), el("span", {class: "meta"}, facts.join(" · ")),
                         toggle);
  const body = kind === "block" ? [...blockPage(REPORT), ...findingsSection(REPORT.flags, REPORT.diagnosis,
                                                                            (f) => f.step ? `step-${f.step}` : null)]
    : PAGES[kind](REPORT);
  document.getElementById("page").replaceChildren(...fontNote(), ...settingsSection(REPORT.config), ...body);
  drawSkips();
}

function tooltips() {
  const tip = document.getElementById("tip");
  document.addEventListener("mouseover", (event) => {
    const target = event.target.closest("[data-tip]");
    if (!target) { tip.hidden = true; return; }
    tip.textContent = target.getAttribute("data-tip");
    tip.hidden = false;
  });
  document.addEventListener("mousemove", (event) => {
    tip.style.left = `${event.clientX + 12}px`;
    tip.style.top = `${event.clientY + 12}px`;
  });
}

/* The page draws once its Chinese glyphs (render/html.py) are decoded: text laid out before a face loads can keep
   its fallback boxes in Chromium. */
const carried = document.fonts ? document.fonts.load('16px "blocktrace CJK"', "猫").catch(() => []) : Promise.resolve([]);
carried.then(() => {
  render();
  tooltips();
  window.addEventListener("resize", drawSkips);
});
