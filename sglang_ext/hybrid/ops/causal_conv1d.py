"""Depthwise causal conv1d with a rolling state: SGLang's `causal_conv1d_fn` (extend) and `causal_conv1d_update`
(decode, and target verify of chain or tree drafts) from `kernels/ops/mamba/causal_conv1d_triton.py`, in torch.

With width W the state of a sequence is its last W-1 inputs, held in conv_states[slot, :, :W-1]
([slots, dim, state_len], state_len >= W-1). Output t = act(bias + sum_j weight[:, j] * window[t + j]) where
window = [state | x] along time.
"""


import torch
import torch.nn.functional as F

from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption
from sglang_ext.hybrid.ops.gating import compute_dtype

PAD_SLOT_ID = -1


def _activation(activation: bool | str | None) -> bool:
    """True for SiLU; the kernels know only silu/swish or none."""
    if activation is True or activation in ("silu", "swish"):
        return True
    if activation is None or activation is False:
        return False
    raise UnsupportedGdnOption(f"causal conv1d: activation {activation!r} is not supported (silu, swish or None)")


def _convolve(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """window: [N, dim, W-1+T] -> [N, dim, T] in window's dtype."""
    out = F.conv1d(window, weight.to(window.dtype).unsqueeze(1), None if bias is None else bias.to(window.dtype),
                   groups=weight.shape[0])
    return F.silu(out) if silu else out


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: list[int],
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    validate_data: bool = False,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Extend over varlen sequences. x: [dim, total_tokens] (sequences concatenated, bounds in query_start_loc
    [N+1]); weight: [dim, W]. Sequence n reads conv_states[cache_indices[n]] as the W-1 earlier inputs when
    has_initial_state[n] (zeros otherwise) and leaves its own last W-1 inputs there. A sequence whose slot is
    pad_slot_id is skipped (its output rows are zeros). block_table only schedules the CUDA launch: no effect here.
    Returns out: [dim, total_tokens] in x's dtype."""
    silu = _activation(activation)
    dim, _ = x.shape
    width = weight.shape[1]
    dt = compute_dtype(x, weight)
    out = torch.zeros_like(x)
    cu = [int(c) for c in query_start_loc.tolist()]
    slots = cache_indices.tolist() if cache_indices is not None else list(range(len(cu) - 1))
    has_init = has_initial_state.tolist() if has_initial_state is not None else [False] * (len(cu) - 1)
    for n in range(len(cu) - 1):
        start, end = cu[n], cu[n + 1]
        slot = slots[n]
        if end <= start or slot == pad_slot_id:
            continue
        if conv_states is not None and has_init[n]:
            prior = conv_states[slot, :, : width - 1].to(dt)
        else:
            prior = torch.zeros(dim, width - 1, dtype=dt, device=x.device)
        window = torch.cat([prior, x[:, start:end].to(dt)], dim=1)
        out[:, start:end] = _convolve(window.unsqueeze(0), weight, bias, silu)[0].to(x.dtype)
        if conv_states is not None:
            conv_states[slot, :, : width - 1] = window[:, -(width - 1):].to(conv_states.dtype)
    return out


def _tree_parents(next_token: list[int], next_sibling: list[int]) -> list[int]:
    """Parent step of each draft step from the first-child / next-sibling links (root: 0), as the kernel builds
    them while walking the steps in order."""
    parents = [0] * len(next_token)
    for t in range(len(next_token)):
        if next_token[t] != -1:
            parents[next_token[t]] = t
        if next_sibling[t] != -1:
            parents[next_sibling[t]] = parents[t]
    return parents


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: bool | str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    num_accept_tokens: torch.Tensor | None = None,
    intermediate_conv_window: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    retrieve_next_token: torch.Tensor | None = None,
    retrieve_next_sibling: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    metadata=None,
    validate_data: bool = False,
) -> torch.Tensor:
    """x: [B, dim] (one token) or [B, dim, T] (T draft tokens); conv_state: [slots, dim, state_len].

    Row b uses slot conv_state_indices[b] (b itself without indices; pad_slot_id: skipped, output zeros). Its
    state moves on by all T tokens. With intermediate_conv_window ([slots, T_max, dim, >= W-1]) the W-1 inputs
    ending at step t go to window[intermediate_state_indices[b], t]. With retrieve_next_token /
    retrieve_next_sibling ([B, T], tree drafts) step t convolves along its ancestry instead of the previous steps,
    and the parent of each step is written to retrieve_parent_token ([B, T]; the root's is 0).
    Returns the output in x's shape and dtype."""
    if cache_seqlens is not None or num_accept_tokens is not None:
        raise UnsupportedGdnOption("causal_conv1d_update: cache_seqlens (circular state) and num_accept_tokens are "
                                   "not supported by the torch op")
    tree = retrieve_next_token is not None
    if tree and (retrieve_next_sibling is None or retrieve_parent_token is None):
        raise ValueError("causal_conv1d_update: tree drafts need retrieve_next_sibling and retrieve_parent_token")
    if intermediate_conv_window is not None and (conv_state_indices is None or intermediate_state_indices is None):
        raise ValueError("causal_conv1d_update: intermediate_conv_window needs conv_state_indices and "
                         "intermediate_state_indices")
    silu = _activation(activation)
    single = x.dim() == 2
    x3 = x.unsqueeze(-1) if single else x
    batch, _, steps = x3.shape
    width = weight.shape[1]
    dt = compute_dtype(x, weight)
    out = torch.zeros_like(x3)
    slots = conv_state_indices.tolist() if conv_state_indices is not None else list(range(batch))
    snaps = intermediate_state_indices.tolist() if intermediate_conv_window is not None else [-1] * batch
    live = [i for i in range(batch) if slots[i] != pad_slot_id]
    if not live:
        return out.squeeze(-1) if single else out
    live_slots = [slots[i] for i in live]
    prior = conv_state[live_slots][:, :, : width - 1].to(dt)  # [L, dim, W-1]
    xs = x3[live].to(dt)
    window = torch.cat([prior, xs], dim=2)  # [L, dim, W-1+T]
    conv_state[live_slots, :, : width - 1] = window[:, :, -(width - 1):].to(conv_state.dtype)
    if not tree:
        out[live] = _convolve(window, weight, bias, silu).to(x.dtype)
        if intermediate_conv_window is not None:
            for j, i in enumerate(live):
                if snaps[i] >= 0:
                    for t in range(steps):
                        intermediate_conv_window[snaps[i], t, :, : width - 1] = (
                            window[j, :, t + 1: t + width].to(intermediate_conv_window.dtype))
        return out.squeeze(-1) if single else out
    next_tokens, next_siblings = retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    for j, i in enumerate(live):
        parents = _tree_parents(next_tokens[i][:steps], next_siblings[i][:steps])
        retrieve_parent_token[i, :steps] = torch.tensor(parents, dtype=retrieve_parent_token.dtype,
                                                         device=retrieve_parent_token.device)
        for t in range(steps):
            # the W inputs ending at step t along its ancestry: step t, its parent, ..., then the state's columns
            cols, node = [], t
            for _ in range(width):
                if node >= 0:
                    cols.append(xs[j, :, node])
                    node = parents[node] if node > 0 else -1
                else:
                    cols.append(prior[j, :, width - 1 + node])
                    node -= 1
            path = torch.stack(cols[::-1], dim=1)  # [dim, W], oldest first
            out[i, :, t] = _convolve(path.unsqueeze(0), weight, bias, silu)[0, :, 0].to(x.dtype)
            if intermediate_conv_window is not None and snaps[i] >= 0:
                intermediate_conv_window[snaps[i], t, :, : width - 1] = path[:, 1:].to(intermediate_conv_window.dtype)
    return out.squeeze(-1) if single else out
