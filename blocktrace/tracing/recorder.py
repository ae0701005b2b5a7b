"""The hooks of a trace: what each step produced, measured inside the forward pass.

A Recorder attaches forward hooks to a block's step modules (and its attention), measures
each value as it passes — statistics as small device tensors, nothing read on the host until
the trace copies them all at once (tracing.assembly) — and detaches. It does not call the
block: `tracer.trace` does, once; a training watch can attach it around a forward that
training runs anyway.

A hook that fails raises HookFailure, so that a bug in blocktrace is never reported as the
user's forward raising.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import torch

from blocktrace.model.moe import router_distribution
from blocktrace.tracing.probes import ProbeContext, ffn_probe, step_probe
from blocktrace.tracing.routing import routing_moments
from blocktrace.tracing.softmax import SoftmaxSeen, as_heads
from blocktrace.tracing.stats import attention_chunk_stats, tensor_moments, weights_only_stats
from blocktrace.tracing.steps import Layout, StepSpec, resolve
from blocktrace.vocab import Capture

PREVIEW_MAX_TOKENS = 16  # attention matrices up to this size are kept for the text heatmap
# Longer inputs get an attention map instead (for the HTML page, when asked): the first sequence's weights pooled to
# at most this many cells a side, each cell the largest weight among the query-key pairs it covers. A GPT-2-small
# layer at T = 1024: 12 heads × 47 × 47 cells of 22 × 22 pairs.
MAP_CELLS = 48


def map_cell(t: int) -> int:
    """The tokens one side of a map cell covers: as few as keep the map within MAP_CELLS a side."""
    return -(-t // MAP_CELLS)


def pooled_attention(weights: torch.Tensor, rows: slice, cell: int, grid: int,
                     into: Optional[torch.Tensor]) -> torch.Tensor:
    """The first sequence's weights of the query rows `rows` ([..., H, rows, T]) folded into `into` ([H, grid, grid],
    made when None): each cell keeps the largest weight of its cell × cell block of queries and keys. On the device;
    the weights are ≥ 0, so the zeros of a fresh map and of the padding past T change no maximum."""
    first = weights.reshape(-1, *weights.shape[-3:])[0].float()  # [H, rows, T]
    heads, count, t = first.shape
    by_key = torch.nn.functional.pad(first, (0, grid * cell - t)).view(heads, count, grid, cell).amax(-1)
    query_cells = torch.arange(rows.start, rows.start + count, device=first.device) // cell
    if into is None:
        into = first.new_zeros(heads, grid, grid)
    return into.scatter_reduce_(1, query_cells[None, :, None].expand(heads, count, grid), by_key, "amax")


class HookFailure(Exception):
    """An exception raised inside one of blocktrace's hooks (not by the block's own code)."""

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


def _guarded(hook):
    @functools.wraps(hook)
    def run(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except HookFailure:
            raise
        except Exception as error:
            raise HookFailure(error) from error
    return run


@dataclass
class Pending:
    """What a hook saw, still as device tensors: copied to Python once, after the forward."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    stats: torch.Tensor  # tensor_moments
    tensor: Optional[torch.Tensor]  # the value itself, when the caller keeps tensors
    sample: Optional[torch.Tensor]
    probe: dict = field(default_factory=dict)
    # The value and its inputs (references, no copies), held until the trace is copied: should the value prove
    # not finite, its NaN and Inf are counted then, without a host read per step on the healthy path.
    held: dict = field(default_factory=dict)


def first_tensor(value) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


class AttentionAccumulator:
    """Attention diagnostics summed over the chunks of query rows the attention computes."""

    def __init__(self, keep_tensors: bool, token_mask: Optional[torch.Tensor] = None, attention_map: bool = False):
        self.keep_tensors = keep_tensors
        self.attention_map = attention_map  # pool a long input's weights into a map (MAP_CELLS)
        self.map: Optional[torch.Tensor] = None
        self.token_mask = token_mask  # [B, T], False at padding
        self.scores = None  # the current chunk's scores, until its weights arrive
        # (c, head width) where the code scaled q·kᵀ by a plain number c (tracing/softmax.py); None where not seen
        self.score_scale: Optional[tuple[float, int]] = None
        # (the axis a softmax normalised, the axis the product with v summed over) where they differ (softmax.py)
        self.contracted_elsewhere: Optional[tuple[int, int]] = None
        self.chunks: list[dict] = []
        self.kept: list[torch.Tensor] = []
        self.shape_lead = None

    def add(self, weights: torch.Tensor, rows: Optional[slice], keys_before: int = 0) -> None:
        """One chunk of query rows' weights; `keys_before`, keys that precede the first query's own (memory keys, a
        prefix): query i's own key is key i + keys_before."""
        weights = weights.detach()
        if self.scores is not None:
            self.chunks.append(attention_chunk_stats(weights, self.scores, rows, self.token_mask, keys_before))
        else:
            self.chunks.append(weights_only_stats(weights))
        self.scores = None
        self.shape_lead = tuple(weights.shape[:-2]), weights.shape[-1]
        t = weights.shape[-1]
        if self.keep_tensors or t <= PREVIEW_MAX_TOKENS:
            self.kept.append(weights)
        if self.attention_map and t > PREVIEW_MAX_TOKENS:
            cell = map_cell(t)
            self.map = pooled_attention(weights, rows if rows is not None else slice(0, weights.shape[-2]), cell,
                                        -(-t // cell), self.map)

    def result(self, reducer=None) -> dict:
        """The chunks merged; with a reducer (a distributed watch), summed and maximised across ranks too."""
        if not self.chunks:
            return {}
        lead, t = self.shape_lead
        summed = {key: torch.stack([c[key].double() for c in self.chunks]).sum(0)
                  for key in ("entropy_sum", "future_weight_sum", "first_sum", "self_sum", "previous_sum", "rows",
                              "previous_rows")}
        logits = [c["max_logit"] for c in self.chunks if c["max_logit"] is not None]
        largest = {"max_weight": torch.stack([c["max_weight"] for c in self.chunks]).amax(),
                   "max_logit": torch.stack(logits).amax() if logits else None}
        if reducer is not None:
            summed = {key: reducer.summed(value) for key, value in summed.items()}
            largest = {key: None if value is None else reducer.largest(value) for key, value in largest.items()}
        rows, previous_rows = summed["rows"].clamp_min(1), summed["previous_rows"].clamp_min(1)
        merged = {
            "shape": (*lead, t, t),
            "future_weight_sum": summed["future_weight_sum"],
            "entropy_per_head": summed["entropy_sum"] / rows,
            **largest,
            "first_weight": summed["first_sum"] / rows, "self_weight": summed["self_sum"] / rows,
            "previous_weight": summed["previous_sum"] / previous_rows,
        }
        if self.map is not None:
            merged["map"] = self.map
        return {**merged, **self._kept_weights(t)}

    def _kept_weights(self, t: int) -> dict:
        """The whole weights kept chunk by chunk: the tensor where asked for, the preview's first map where T is
        small enough to show."""
        if not self.kept:
            return {}
        full = torch.cat(self.kept, dim=-2)
        kept = {"tensor": full if self.keep_tensors else None}
        if t <= PREVIEW_MAX_TOKENS:
            kept["preview"] = full.reshape(-1, *full.shape[-3:])[0]
        return kept


class Recorder:
    """Hooks on one block's steps; `attach`, let the block run, `detach`, read `steps`."""

    def __init__(self, block, layout: Layout, own: bool, *, keep_tensors=False, sample_token=0, sample_size=0,
                 checks=False, token_mask=None, tolerant=False, attention_map=False):
        self.block, self.layout, self.own = block, layout, own  # own: blocktrace's TransformerBlock
        self.keep_tensors = keep_tensors
        self.sample_token, self.sample_size = sample_token, sample_size
        self.token_mask = token_mask  # [B, T], False at padding: left out of every statistic
        self.probes = ProbeContext.of(block, layout, own, token_mask) if checks else None
        self.steps: list[Pending] = []
        self.substeps: list[Pending] = []
        self.attention = AttentionAccumulator(keep_tensors, token_mask, attention_map)
        self.handles: list = []
        self.input: Optional[Pending] = None  # the block input, once start() has seen it
        self.derived = {name: (stream, update) for name, stream, update in layout.derived}
        self.held: dict[str, torch.Tensor] = {}  # step values the derived steps still need
        self.router_logits: Optional[torch.Tensor] = None
        self.router_probs: Optional[torch.Tensor] = None
        self.routing: Optional[torch.Tensor] = None  # a mixture of experts' routing moments (tracing.routing)
        self.routing_k = 0  # the experts each token goes to
        # tolerant (a Watch inside someone's training): a hook that fails is kept in `failure` and the hooks go
        # quiet, instead of raising inside the training loop's forward
        self.tolerant, self.failure = tolerant, None

    def guard(self, hook):
        """A hook whose failure is a HookFailure (never the block's own error) — kept, not raised, when tolerant."""
        guarded = _guarded(hook)
        if not self.tolerant:
            return guarded

        def run(*args, **kwargs):
            if self.failure is not None:
                return None
            try:
                return guarded(*args, **kwargs)
            except HookFailure as failure:
                self.failure = failure
                return None
        return run

    def start(self, x: torch.Tensor) -> Pending:
        """The block input, as the pseudo-step `x`."""
        self._hold("x", x)
        self.input = self.observe("x", x)
        return self.input

    def _hold(self, name: str, value: torch.Tensor) -> None:
        if any(name in sources for sources in self.derived.values()):
            self.held[name] = value.detach()

    def _derive(self) -> None:
        """Record a step the block never materialises once both of its parts have been seen."""
        for target, (stream, update) in list(self.derived.items()):
            if stream in self.held and update in self.held:
                del self.derived[target]
                self.steps.append(self.observe(target, self.held[stream] + self.held[update]))
                self._hold(target, self.steps[-1].tensor if self.keep_tensors else self.held[stream] + self.held[update])

    def observe(self, name: str, value: torch.Tensor, inputs=()) -> Pending:
        value = value.detach()
        sample = None
        if self.sample_size and value.numel():
            row = value.reshape(-1, value.shape[-2], value.shape[-1])[0, self.sample_token]
            sample = row[: self.sample_size].clone()
        held = {"value": value, "inputs": [t.detach() for t in inputs if isinstance(t, torch.Tensor)]}
        pending = Pending(name, tuple(value.shape), str(value.dtype).replace("torch.", ""),
                          tensor_moments(value, self.token_mask), value if self.keep_tensors else None, sample,
                          held=held)
        if self.probes is not None:
            pending.probe.update(step_probe(self.probes, name, value))
            if name == "ffn" and self.probes.ffn_hidden is not None:
                held["hidden"], self.probes.ffn_hidden = self.probes.ffn_hidden, None
        return pending

    def record(self, name: str, value, inputs=()) -> None:
        value = first_tensor(value)
        if value is None or any(p.name == name for p in self.steps):
            return  # a module called twice is traced at its first call
        self.steps.append(self.observe(name, value, inputs))
        self._hold(name, value)
        self._derive()

    def attach(self) -> None:
        try:
            for spec in self.layout.specs:
                module = resolve(self.block, spec)
                if spec.capture is Capture.INPUT:
                    hook = self.guard(lambda m, args, name=spec.name: self.record(name, args[0] if args else None, args))
                    self.handles.append(module.register_forward_pre_hook(hook))
                else:
                    hook = self.guard(lambda m, args, out, name=spec.name: self.record(name, out, args))
                    self.handles.append(module.register_forward_hook(hook))
            self.handles += self._attention_hooks()
            self.handles += self._routing_hooks()
            if self.probes is not None and self.layout.hidden:
                hidden = resolve(self.block, StepSpec("ffn", self.layout.hidden))
                hook = self.guard(lambda m, a, out: ffn_probe(self.probes, out))
                self.handles.append(hidden.register_forward_hook(hook))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _routing_hooks(self) -> list:
        """A mixture of experts' router: from its logits, probabilities and choice, what it did with the tokens."""
        if not self.own:
            return self._hf_router_hooks()
        ffn = getattr(self.block, "ffn", None)
        if not hasattr(ffn, "router_probs"):
            return []

        def on_logits(module, inputs, logits):
            self.router_logits = logits.detach()

        def on_probs(module, inputs, probs):
            self.router_probs = probs.detach()

        def on_chosen(module, inputs, chosen):
            self._route(self.router_logits, self.router_probs, chosen)

        return [ffn.router_logits.register_forward_hook(self.guard(on_logits)),
                ffn.router_probs.register_forward_hook(self.guard(on_probs)),
                ffn.chosen.register_forward_hook(self.guard(on_chosen))]

    def _hf_router_hooks(self) -> list:
        """HF's routers return their logits first and the experts chosen last (an integer tensor), and keep their
        top_k; their probabilities are the family's distribution of the logits (model.moe), in float32, as they
        compute them. A router that returns no choice (Mixtral's own top-k of its probabilities) is read by it."""
        if self.layout.router is None:
            return []
        try:
            router = self.block.get_submodule(self.layout.router)
        except AttributeError:  # a dense layer of a mostly sparse model (DeepSeek's first layers, Qwen's mlp_only)
            return []

        def on_output(module, inputs, output):
            logits = (output[self.layout.router_logits_at] if isinstance(output, tuple) else output).detach()
            shape = (*self.input.shape[:-1], logits.shape[-1]) if self.input is not None else logits.shape
            logits = logits.reshape(shape)
            probs = router_distribution(self.layout.router_kind, logits)
            self._route(logits, probs, _hf_choice(output, probs, module.top_k).reshape(*shape[:-1], -1))

        return [router.register_forward_hook(self.guard(on_output))]

    def _route(self, logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> None:
        if self.routing is None:  # a block called twice is traced at its first call
            self.routing = routing_moments(logits, probs, chosen, self.token_mask, PREVIEW_MAX_TOKENS)
            self.routing_k = chosen.shape[-1]

    def _attention_hooks(self) -> list:
        return self._own_attention_hooks() if self.own else self._user_attention_hooks()

    def _own_attention_hooks(self) -> list:
        """Our attention exposes its scores and weights, and every step its sub-steps, through hook points."""
        attention = self.block.attn

        def on_scores(module, inputs, scores):
            self.attention.scores = scores.detach()

        inside = [module.get_submodule(name).register_forward_hook(self.guard(
            lambda m, i, out, name=f"{step}.{name}": self.substeps.append(self.observe(name, out))))
            for step, module in (("attn", attention), ("ffn", self.block.ffn))
            for name in getattr(module, "substeps", ())]
        if self.block.config.token_mixer is not None:  # a mixer without attention weights (a short convolution)
            return inside
        return [*inside, attention.scores.register_forward_hook(self.guard(on_scores)),
                attention.weights.register_forward_hook(self.guard(
                    lambda m, i, weights: self.attention.add(weights, attention.rows)))]

    def _user_attention_hooks(self) -> list:
        """A user's attention module: its softmax seen while it runs (SoftmaxSeen), or the weights it returns."""
        module = resolve(self.block, StepSpec("attn", self.layout.attention_path))
        watching: Optional[SoftmaxSeen] = None
        called = False

        def on_input(module, args):
            nonlocal watching, called
            if not called:  # a module called twice is traced at its first call
                called, watching = True, SoftmaxSeen()
                watching.__enter__()

        def on_output(module, inputs, output):
            nonlocal watching
            if watching is None:
                return
            mode, watching = watching, None
            mode.__exit__(None, None, None)
            self._take_attention(mode, output)

        # always_call: a forward that raises leaves the mode too
        return [module.register_forward_pre_hook(self.guard(on_input)),
                module.register_forward_hook(self.guard(on_output), always_call=True)]

    def _take_attention(self, mode: SoftmaxSeen, output) -> None:
        """What a user's attention module showed of its weights: the ones it returns; else, where sdpa measured
        none, the ones its own softmax computed (SoftmaxSeen)."""
        self.attention.score_scale = mode.scale
        self.attention.contracted_elsewhere = mode.contracted_elsewhere
        weights = _attention_weights(output)
        if weights is not None:
            self.attention.add(weights, None)
        elif not self.attention.chunks:
            for scores, weights in mode.seen:
                self.attention.scores, weights = as_heads(scores, weights)
                self.attention.add(weights, slice(0, weights.shape[-2]))


def _attention_weights(output) -> Optional[torch.Tensor]:
    """The `[..., H, T, T]` weights in a module's output tuple, if it returns them."""
    if not isinstance(output, (tuple, list)):
        return None
    for value in output[1:]:
        if isinstance(value, torch.Tensor) and value.dim() >= 3 and value.shape[-1] == value.shape[-2]:
            return value
    return None


def _hf_choice(output, probs: torch.Tensor, k: int) -> torch.Tensor:
    """The experts a HF router chose, largest weight first: its last output when that is an integer tensor (ordered
    by the weights beside it, where it returns them), else the top-k of its probabilities."""
    last = output[-1] if isinstance(output, tuple) else None
    if not isinstance(last, torch.Tensor) or last.is_floating_point():
        return torch.topk(probs, k, dim=-1).indices
    chosen, weights = last.detach(), output[-2] if len(output) >= 3 else None
    if isinstance(weights, torch.Tensor) and weights.shape == chosen.shape:
        chosen = chosen.gather(-1, weights.detach().argsort(dim=-1, descending=True))
    return chosen
