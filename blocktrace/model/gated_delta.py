"""A token mixer without attention: the gated delta rule (config.GatedDeltaNet), HF's Qwen3NextGatedDeltaNet op for
op, its chunked form included (torch_chunk_gated_delta_rule, the one HF runs over a prompt), so the numbers are HF's.
It fills the block's `attn` step; what it computes inside are its own sub-steps: `q`, `k`, `v` (after the causal
convolution and SiLU), `z` (the output gate), `beta` (each value head's write rate, in (0, 1)), `decay` (its log
decay g ≤ 0: the state is multiplied by exp(g) at each token), `delta` (what the state read gives, before the gated
norm) and `gated` (after it). It has no attention weights: no attention diagnostics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.mixer import RecurrentMixer, causal_conv

CHUNK = 64  # tokens per chunk of the delta rule: HF's default, with which its model calls it
L2_EPS = 1e-6  # the eps of q's and k's L2 norm inside the rule (HF's l2norm, as the FLA library's kernel)


class GatedRMSNorm(nn.Module):
    """HF's Qwen3NextRMSNormGated: RMSNorm in float32 (gain w, not 1 + w), then × SiLU(z) in float32."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(RecurrentMixer):
    """out_proj(GatedRMSNorm(rule(q, k, v, β, g), z)), where [q, k, v, z] and [β, g]'s inputs come from in_proj_qkvz
    and in_proj_ba (grouped by key head, as HF stores them) and q, k, v pass conv and SiLU."""

    SUBSTEPS = ("q", "k", "v", "z", "beta", "decay", "delta", "gated")
    LABEL = "GatedDeltaNet[{value_heads} heads, conv {kernel}]"

    def __init__(self, config: BlockConfig):
        super().__init__()
        spec, d = config.token_mixer, config.d_model
        self.spec = spec
        self.key_width, self.value_width = spec.key_heads * spec.key_dims, spec.value_heads * spec.value_dims
        conv_width = 2 * self.key_width + self.value_width
        self.in_proj_qkvz = nn.Linear(d, 2 * self.key_width + 2 * self.value_width, bias=False)
        self.in_proj_ba = nn.Linear(d, 2 * spec.value_heads, bias=False)
        self.conv = nn.Conv1d(conv_width, conv_width, spec.kernel, groups=conv_width, bias=False,
                              padding=spec.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(spec.value_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(spec.value_heads).uniform_(1, 16)))  # HF's init range
        self.norm = GatedRMSNorm(spec.value_dims, spec.norm_eps or config.eps)
        self.out_proj = nn.Linear(self.value_width, d, bias=False)

    @staticmethod
    def operations(config: BlockConfig) -> dict[str, str]:
        k = config.token_mixer.kernel
        return {"attn.q": f"q = SiLU(CausalConv[{k}](in_proj_qkvz(x_in)))  (per key head)",
                "attn.k": f"k = SiLU(CausalConv[{k}](in_proj_qkvz(x_in)))  (per key head)",
                "attn.v": f"v = SiLU(CausalConv[{k}](in_proj_qkvz(x_in)))  (per value head)",
                "attn.z": "z = in_proj_qkvz(x_in)  (the output gate)",
                "attn.beta": ("β = sigmoid(in_proj_ba(x_in))" if config.token_mixer.beta_scale == 1 else
                              f"β = {config.token_mixer.beta_scale:g}·sigmoid(in_proj_ba(x_in))")
                + "  (the write rate per value head)",
                "attn.decay": "g = −exp(A_log) · softplus(in_proj_ba(x_in) + dt_bias)  (state × exp(g) per token)",
                "attn.delta": "o = Sᵀq,  S ← exp(g)·S + β·k(v − Sᵀk)ᵀ  (q, k L2-normalised)",
                "attn.gated": "RMSNorm(o) · SiLU(z)  per head  (attn_out = out_proj of it)"}

    def mix(self, h: torch.Tensor, unbatched: bool) -> torch.Tensor:
        q, k, v, z, b, a = self._streams(self.masked(h))
        q, k, v = self._convolved(q, k, v)
        beta = b.sigmoid() if self.spec.beta_scale == 1 else b.sigmoid() * self.spec.beta_scale  # as HF: × 2.0
        decay = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # float: fp16's A may be inf
        for name, value in {"q": q, "k": k, "v": v, "z": z, "beta": beta, "decay": decay}.items():
            self.seen(name, value, unbatched)
        spec = self.spec
        delta = chunk_gated_delta_rule(_heads(q, spec.key_dims), _heads(k, spec.key_dims),
                                       _heads(v, spec.value_dims), decay, beta)  # [B, T, Hv, dv]
        self.seen("delta", delta.reshape(*delta.shape[:2], -1), unbatched)
        gated = self.norm(delta.reshape(-1, spec.value_dims), z.reshape(-1, spec.value_dims))
        return self.out_proj(self.seen("gated", gated.reshape(*h.shape[:2], self.value_width), unbatched))

    def _streams(self, h: torch.Tensor):
        """HF's fix_query_key_value_ordering: each key head's q, k, its value heads' v and z side by side in
        in_proj_qkvz, their b and a in in_proj_ba. Returns q, k [B, T, Hk·dk], v, z [B, T, Hv·dv], b, a [B, T, Hv]."""
        spec, lead = self.spec, h.shape[:-1]
        per_key = spec.value_heads // spec.key_heads
        qkvz = self.in_proj_qkvz(h).view(*lead, spec.key_heads, -1)
        ba = self.in_proj_ba(h).view(*lead, spec.key_heads, -1)
        q, k, v, z = torch.split(qkvz, [spec.key_dims, spec.key_dims, per_key * spec.value_dims,
                                        per_key * spec.value_dims], dim=-1)
        b, a = torch.split(ba, [per_key, per_key], dim=-1)
        return (*(x.reshape(*lead, -1) for x in (q, k, v, z)), b.reshape(*lead, -1), a.reshape(*lead, -1))

    def _convolved(self, q, k, v):
        """HF's causal_conv1d_fn with SiLU over [q, k, v]: the activation in the filter's dtype, cast back after it."""
        mixed = torch.cat((q, k, v), dim=-1).transpose(1, 2)
        out = F.silu(causal_conv(mixed, self.conv)).to(mixed.dtype).transpose(1, 2)
        return torch.split(out, [self.key_width, self.key_width, self.value_width], dim=-1)


def _heads(x: torch.Tensor, dims: int) -> torch.Tensor:
    """[B, T, H·dims] as [B, T, H, dims]."""
    return x.reshape(*x.shape[:2], -1, dims)


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor,
                           beta: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """The gated delta rule over a prompt from a zero state, in chunks as HF's torch_chunk_gated_delta_rule computes
    it (the same operations in the same order, so the same numbers): inside a chunk the rule's updates are solved at
    once (the UT transform, a unit lower-triangular system), across chunks the state carries. q, k [B, T, Hk, dk],
    v [B, T, Hv, dv], decay and beta [B, T, Hv]; returns [B, T, Hv, dv] in q's dtype. Equal, to rounding, to the
    token-by-token recurrence (tests/test_qwen3_next.py holds it to a naive loop)."""
    dtype, (batch, tokens, key_heads, key_dims) = query.dtype, key.shape
    value_heads, value_dims = value.shape[-2:]
    if key_heads != value_heads:  # each q·k head serves value_heads / key_heads consecutive value heads
        query = query.repeat_interleave(value_heads // key_heads, dim=2)
        key = key.repeat_interleave(value_heads // key_heads, dim=2)
    query, key, value, beta, decay = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                      for x in (query, key, value, beta, decay))
    query, key = _l2_normalised(query), _l2_normalised(key)
    query = query * key_dims ** -0.5
    pad = (chunk - tokens % chunk) % chunk
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, decay = (F.pad(x, (0, pad)) for x in (beta, decay))
    v_beta, k_beta = value * beta.unsqueeze(-1), key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = (x.reshape(x.shape[0], x.shape[1], -1, chunk, x.shape[-1])
                                  for x in (query, key, k_beta, v_beta))
    decay = decay.reshape(decay.shape[0], decay.shape[1], -1, chunk)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu(1)
    cumulative = decay.cumsum(dim=3)  # log of the decay from the chunk's start to each token
    pairwise = (cumulative.unsqueeze(4) - cumulative.unsqueeze(3)).masked_fill(later, float("-inf")).exp()
    system = (k_beta @ key.transpose(-1, -2)) * pairwise
    within = (query @ key.transpose(-1, -2)) * pairwise
    decayed_k_beta = k_beta * cumulative.exp().unsqueeze(-1)
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, decayed_k_beta, upper=False, unitriangular=True)
    state = torch.zeros(batch, value_heads, key_dims, value_dims, dtype=new_values.dtype, device=new_values.device)
    out = torch.zeros_like(new_values)
    query = query * cumulative.exp().unsqueeze(-1)
    key = key * (cumulative[..., -1:] - cumulative).exp().unsqueeze(-1)
    chunk_decay = cumulative[..., -1].exp()[..., None, None]
    for i in range(new_values.shape[2]):  # the state carried from chunk to chunk
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        out[:, :, i] = query[:, :, i] @ state + within[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(batch, value_heads, -1, value_dims)[:, :, :tokens]
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)
