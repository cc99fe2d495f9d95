"""NEXTN speculative decoding without SGLang: a Llama-shaped target and one MTP layer over KV pool planes of our
formats, through our store / decode / extend kernels. Every step has fixed shapes, so on a GPU each stage is one
CUDA-graph replay and no stage waits for the host.

What it is for: SGLang does not run on the lent H200, so the net decode speed-up of NEXTN over our kernels is
measured with this loop (tools/spec_gpu_loop.py) on the built-in model and a train-draft checkpoint. It does
what SGLang's EAGLE worker does for `--speculative-algorithm NEXTN --speculative-num-steps k
--speculative-eagle-topk 1 --speculative-num-draft-tokens k+1` (chain drafts) or `--speculative-eagle-topk K` with
the same k + 1 verified tokens (tree drafts), greedy, with no scheduler and no sampling. Core code: no SGLang
import.

Slots: request b's token at position p lives in slot b * max_ctx + p of every layer's planes (the target's planes
and the draft's own). Between rounds, per request, `pos` is the position of the newest token `tok` (known, not yet
through the target); the target's and the draft's KV hold the positions before it; `drafts[:, 0]` and `hidden` are
the draft's first token and its output there. A round (k = steps):

1. draft: steps 2..k of the MTP at positions pos .. pos + k - 2, each on the previous step's output and token.
2. verify: the target over [tok, d_1 .. d_k] at positions pos .. pos + k: greedy tokens g_0 .. g_k, hidden states
   after the final norm. m = the leading drafts equal to the target's tokens (d_i == g_{i-1}); the round yields
   g_0 .. g_m (d_1 .. d_m and the target's own next token), so its accept length is m + 1.
3. extend: the MTP over the k + 1 verified rows (the target's hidden state at pos + i and its token g_i): rows
   0..m rewrite the draft KV with the target's hidden states, as SGLang's draft extend does; row m's output gives
   the next round's d_1. Rows after m are rewritten by the next round before anything reads them.
   Then tok = g_m, pos += m + 1.

Tree drafts (topk K > 1) change steps 1-2 as SGLang does: step 1 keeps the draft's K most probable tokens, each
later step runs K branch rows per request (each over the request's draft KV and the branch's own slots of the
earlier steps) and keeps the K best of the K x K extensions by path probability; of all candidates the k of
highest probability are verified with a tree mask (node i sees the root, its ancestors and itself, at position
pos + depth). The deepest node whose every token is its parent's greedy token is accepted, and the K/V of the
nodes on its path is moved (one copy per plane for all layers) from their verify rows' slots to their positions'.

The drafts match what `tools.draft_training.draft_acceptance.chain_drafts` / `tree_drafts` simulate (what
train-draft reports); `tests/tools/test_native_loop.py` checks the loop against the plain decode loop and the
simulation, and `tools/spec_gpu_loop.py agree` does on the built-in model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sglang_ext import kernels
from sglang_ext.kernels.decode import run_decode, tree_mask_bits
from sglang_ext.kernels.decode_plan import plan_decode
from sglang_ext.kvformats import get_format


@dataclass
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    vocab: int

    @classmethod
    def of(cls, config: dict) -> Shape:
        rope = config.get("rope_parameters") or {}
        return cls(hidden=config["hidden_size"], heads=config["num_attention_heads"],
                   kv_heads=config["num_key_value_heads"],
                   head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
                   eps=config["rms_norm_eps"], rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
                   vocab=config["vocab_size"])


@dataclass
class Block:
    """One decoder layer's weights: q/k/v as one matrix (and bias, Qwen2), gate/up as one."""
    ln1: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def of(cls, w: dict, prefix: str, dtype, device) -> Block:
        def get(name):
            return w[prefix + name].to(device=device, dtype=dtype).contiguous()
        qkv = torch.cat([get(f"self_attn.{p}_proj.weight") for p in "qkv"])
        bias = None
        if prefix + "self_attn.q_proj.bias" in w:
            bias = torch.cat([get(f"self_attn.{p}_proj.bias") for p in "qkv"])
            if not bias.any():  # the zero biases write_mtp_checkpoint adds to the target: nothing to add
                bias = None
        return cls(ln1=get("input_layernorm.weight"), qkv=qkv, qkv_bias=bias, o=get("self_attn.o_proj.weight"),
                   ln2=get("post_attention_layernorm.weight"),
                   gate_up=torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]),
                   down=get("mlp.down_proj.weight"))


class TargetWeights:
    """A Llama / Qwen2 causal LM from its state dict (Hugging Face names)."""

    def __init__(self, state: dict, config: dict, dtype: torch.dtype, device):
        self.shape = Shape.of(config)
        self.embed = state["model.embed_tokens.weight"].to(device=device, dtype=dtype).contiguous()
        head = state.get("lm_head.weight")
        self.lm_head = self.embed if head is None or config.get("tie_word_embeddings") else \
            head.to(device=device, dtype=dtype).contiguous()
        self.norm = state["model.norm.weight"].to(device=device, dtype=dtype)
        self.layers = [Block.of(state, f"model.layers.{i}.", dtype, device)
                       for i in range(config["num_hidden_layers"])]


class DraftWeights:
    """One MTP layer (tools.draft_training.mtp_layer.MtpLayer's parameter names)."""

    def __init__(self, state: dict, dtype: torch.dtype, device):
        def get(name):
            return state[name].to(device=device, dtype=dtype).contiguous()
        self.token_norm, self.hidden_norm = get("token_layernorm.weight"), get("hidden_layernorm.weight")
        self.input_proj, self.final_norm = get("input_proj.weight"), get("final_layernorm.weight")
        self.block = Block.of(state, "", dtype, device)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with float32 arithmetic: one kernel on a GPU (torch's fused rms_norm computes in float32 for bf16
    inputs); on the CPU through float32 explicitly."""
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def _linear_add(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """residual + x @ weight.T as one GEMM (its epilogue adds the residual)."""
    return torch.addmm(residual, x, weight.t())


class NativeNextn:
    """The target and draft over KV pools of `fmt_name` for `batch` requests of up to `max_ctx` tokens each."""

    def __init__(self, target: TargetWeights, draft: DraftWeights | None, fmt_name: str, batch: int, max_ctx: int,
                 steps: int = 3, capacity: int = 256, topk: int = 1):
        s = self.shape = target.shape
        self.target, self.draft, self.steps, self.topk = target, draft, steps, topk
        self.batch, self.max_ctx = batch, max_ctx
        dev = self.device = target.embed.device
        self.dtype = target.embed.dtype
        self.fmt = get_format(fmt_name, head_dim=s.head_dim)
        self._plans: dict[tuple, object] = {}  # decode plans by (rows, q_len, tree): _block
        slots = self.slots = batch * max_ctx
        # the target's planes: one allocation of every layer's slots, so that moving an accepted tree path's K/V
        # into place is one copy per plane for all layers
        self.target_planes = self.fmt.allocate(len(target.layers) * slots, s.kv_heads, dev)
        self.target_kv = [{n: t[i * slots:(i + 1) * slots] for n, t in self.target_planes.items()}
                          for i in range(len(target.layers))]
        # the draft's: the requests' slots, then (tree drafts) each branch row's own slots for its draft steps
        self.scratch = slots
        self.draft_kv = self.fmt.allocate(slots + batch * topk * steps, s.kv_heads, dev) if draft is not None else None
        self.inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=dev).float() / s.head_dim))
        self.base = torch.arange(batch, device=dev) * max_ctx
        self.scale = s.head_dim ** -0.5
        # state between steps (read and written in place by every stage, so CUDA graphs can replay them)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.tok = torch.zeros(batch, dtype=torch.long, device=dev)
        self.drafts = torch.zeros(batch, steps, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(batch, s.hidden, dtype=self.dtype, device=dev)
        self.verified = torch.zeros(batch, steps + 1, dtype=torch.long, device=dev)
        self.verified_hidden = torch.zeros(batch, steps + 1, s.hidden, dtype=self.dtype, device=dev)
        self.accepted = torch.zeros(batch, dtype=torch.long, device=dev)
        if topk > 1:  # tree drafts: the kept paths (score, last token, tokens, parent's output), every candidate
            cands = topk + (steps - 1) * topk * topk
            self.score = torch.zeros(batch, topk, device=dev)
            self.branch_tok = torch.zeros(batch, topk, dtype=torch.long, device=dev)
            self.paths = torch.zeros(batch, topk, steps, dtype=torch.long, device=dev)
            self.branch_hidden = torch.zeros(batch, topk, s.hidden, dtype=self.dtype, device=dev)
            self.cand_score = torch.zeros(batch, cands, device=dev)
            self.cand_paths = torch.zeros(batch, cands, steps, dtype=torch.long, device=dev)
            self.cand_depth = torch.tensor([1] * topk + [d for d in range(2, steps + 1) for _ in range(topk * topk)],
                                           device=dev)
        # per request: the tokens after its prompt (out, out_len), the rounds run and each round's accept length
        # (log); room for `capacity` tokens and rounds, and one round's worth more
        self.out = torch.zeros(batch, capacity + steps + 1, dtype=torch.long, device=dev)
        self.out_len = torch.zeros(batch, dtype=torch.long, device=dev)
        self.rounds = torch.zeros(batch, dtype=torch.long, device=dev)
        self.log = torch.zeros(batch, capacity + 1, dtype=torch.long, device=dev)
        self.capacity = capacity
        self._graphs = {}

    # ---------------------------------------------------------------------------------------------- layers
    def _index(self, lens: torch.Tensor):
        """kv_indptr [B + 1] int32 and kv_indices [B * max_ctx] int32 listing request b's first lens[b] slots."""
        indptr = F.pad(torch.cumsum(lens, 0), (1, 0)).to(torch.int32)
        p = torch.arange(self.batch * self.max_ctx, device=self.device, dtype=torch.int32)
        b = torch.searchsorted(indptr[1:], p, right=True).clamp_(max=self.batch - 1)
        idx = (b * self.max_ctx + p - indptr[b]).clamp_(0, self.batch * self.max_ctx - 1)
        return indptr, idx.to(torch.int32)

    def _branch_index(self, prefix: torch.Tensor, prefix_base: torch.Tensor, own_base: torch.Tensor, own: int):
        """kv_indptr / kv_indices of rows that each see prefix[r] slots from prefix_base[r] on, then `own` slots
        from own_base[r] on (a tree draft's branch rows: the request's draft KV, then the branch's earlier steps)."""
        rows = prefix.shape[0]
        indptr = F.pad(torch.cumsum(prefix + own, 0), (1, 0)).to(torch.int32)
        p = torch.arange(rows * (self.max_ctx + self.steps), device=self.device, dtype=torch.int32)
        r = torch.searchsorted(indptr[1:], p, right=True).clamp_(max=rows - 1)
        j = p - indptr[r]
        idx = torch.where(j < prefix[r], prefix_base[r] + j, own_base[r] + j - prefix[r])
        return indptr, idx.clamp_(0, next(iter(self.draft_kv.values())).shape[0] - 1).to(torch.int32)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [R, 1, D / 2] (float32) of positions [R]: once per stage, for every layer."""
        ang = positions.float()[:, None, None] * self.inv_freq
        return ang.cos(), ang.sin()

    @staticmethod
    def _rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [R, heads, D] rotated by rope's tables (neox halves), computed in float32."""
        cos, sin = rope
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(x.dtype)

    def _block(self, blk: Block, planes: dict, x: torch.Tensor, rope, slots: torch.Tensor, q_len: int,
               index, tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B * q_len, H] (request-major) at the rows' positions (rope: their tables; slots: their pool slots):
        attention over the pool, each row's K/V stored at its slot first. q_len 1: decode (the prefix includes the
        row itself); > 1: verify / extend split over the prefix (index: the prefix), token j seeing the new tokens
        0..j; index None: a prompt's prefill (one request, causal over its own rows, by the extend kernel)."""
        s = self.shape
        qkv = F.linear(_rms(x, blk.ln1, s.eps), blk.qkv, blk.qkv_bias)
        qk, v = qkv.split([(s.heads + s.kv_heads) * s.head_dim, s.kv_heads * s.head_dim], -1)
        qk = self._rope(qk.view(-1, s.heads + s.kv_heads, s.head_dim), rope)
        q, k = qk[:, :s.heads].contiguous(), qk[:, s.heads:].contiguous()
        v = v.reshape(-1, s.kv_heads, s.head_dim).contiguous()
        kernels.store_kv(self.fmt, planes, slots, k, v)
        o = torch.empty_like(q)
        if index is None:
            empty = torch.zeros(2, dtype=torch.int32, device=self.device)
            rows = torch.tensor([0, q_len], dtype=torch.int32, device=self.device)
            kernels.extend_attention(self.fmt, q, k, v, o, planes, rows, empty, empty, q_len, self.scale)
            return self._block_end(blk, x, o)
        indptr, indices = index
        # every stage is captured once over fixed-size lists whose lengths change each round: planned as a CUDA
        # graph is (lengths unknown, decode_plan's docstring), once per stage shape
        key = (q.shape[0], q_len, tree_mask is not None)
        if key not in self._plans:
            self._plans[key] = plan_decode(self.fmt, planes, batch=q.shape[0] // q_len, num_q_heads=q.shape[1],
                                           q_dtype=q.dtype, seq_lens_sum=None, q_len=q_len,
                                           tree=tree_mask is not None, index_dtype=indices.dtype)
        run_decode(self._plans[key], self.fmt, q, planes, o, indptr, indices, self.scale,
                   new_slots=slots if q_len > 1 else None, tree_mask=tree_mask)
        return self._block_end(blk, x, o)

    def _block_end(self, blk: Block, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The output projection and the MLP, with their residual adds."""
        x = _linear_add(x, o.view(x.shape[0], -1), blk.o)
        gate, up = F.linear(_rms(x, blk.ln2, self.shape.eps), blk.gate_up).chunk(2, -1)
        return _linear_add(x, F.silu(gate) * up, blk.down)

    def _positions(self, start: torch.Tensor, q_len: int) -> torch.Tensor:
        return (start[:, None] + torch.arange(q_len, device=self.device)).reshape(-1)

    def _slots(self, positions: torch.Tensor, q_len: int) -> torch.Tensor:
        return self.base.repeat_interleave(q_len) + positions

    def _stage_index(self, start: torch.Tensor, q_len: int):
        """The attention index of a stage whose rows sit at start .. start + q_len - 1."""
        return self._index(start + 1 if q_len == 1 else start)

    def target_forward(self, tokens: torch.Tensor, start: torch.Tensor, q_len: int, positions=None,
                       tree_mask=None):
        """tokens [B * q_len] at positions start[b] + j (or `positions` [B * q_len]; their slots stay start[b] + j)
        -> (greedy next tokens [B, q_len], hidden states after the final norm [B, q_len, H]). tree_mask: bool
        [B, q_len, q_len], token j seeing the new tokens t where it is set (else 0..j)."""
        t = self.target
        rows = self._positions(start, q_len)
        slots = self._slots(rows, q_len)
        positions = rows if positions is None else positions
        rope, index = self._rope_tables(positions), self._stage_index(start, q_len)
        if tree_mask is not None:  # the mask's bits once for all layers
            tree_mask = tree_mask_bits(tree_mask)
        x = t.embed[tokens]
        for blk, planes in zip(t.layers, self.target_kv):
            x = self._block(blk, planes, x, rope, slots, q_len, index, tree_mask)
        h = _rms(x, t.norm, self.shape.eps)
        greedy = F.linear(h, t.lm_head).float().argmax(-1)
        return greedy.view(self.batch, q_len), h.view(self.batch, q_len, -1)

    def _draft_rows(self, hidden, tokens, positions, slots, q_len: int, index) -> torch.Tensor:
        """The MTP on (hidden [R, H], token [R]) at positions [R], K/V stored at slots [R] -> outputs after
        final_layernorm [R, H]."""
        d, s = self.draft, self.shape
        e = self.target.embed[tokens] * (positions != 0)[:, None].to(self.dtype)  # MiMoMTP zeroes position 0's
        x = F.linear(torch.cat((_rms(hidden, d.hidden_norm, s.eps), _rms(e, d.token_norm, s.eps)), -1), d.input_proj)
        x = self._block(d.block, self.draft_kv, x, self._rope_tables(positions), slots, q_len, index)
        return _rms(x, d.final_norm, s.eps)

    def draft_forward(self, hidden: torch.Tensor, tokens: torch.Tensor, start: torch.Tensor, q_len: int):
        """The MTP on (hidden [B * q_len, H], token [B * q_len]) at positions start[b] + j -> (greedy tokens
        [B, q_len], outputs after final_layernorm [B, q_len, H])."""
        positions = self._positions(start, q_len)
        out = self._draft_rows(hidden, tokens, positions, self._slots(positions, q_len), q_len,
                               self._stage_index(start, q_len))
        greedy = F.linear(out, self.target.lm_head).float().argmax(-1)
        return greedy.view(self.batch, q_len), out.view(self.batch, q_len, -1)

    # ---------------------------------------------------------------------------------------------- prefill
    @torch.no_grad()
    def prefill(self, prompts: list[list[int]]) -> None:
        """Reset every request to its prompt (one per request): the target's KV and its next token, the draft's KV
        and first draft, the outputs. A prompt may take max_ctx - capacity - 2 (steps + 1) tokens."""
        assert len(prompts) == self.batch, (len(prompts), self.batch)
        s, t, d = self.shape, self.target, self.draft
        for buf in (self.out, self.out_len, self.rounds, self.log):
            buf.zero_()
        room = self.max_ctx - self.capacity - 2 * (self.steps + 1)
        for b, prompt in enumerate(prompts):
            n = len(prompt)
            if not 0 < n <= room:
                raise ValueError(f"prompt {b} has {n} tokens: max_ctx {self.max_ctx} with capacity "
                                 f"{self.capacity} and {self.steps} draft steps leaves room for 1..{room}")
            ids = torch.tensor(prompt, device=self.device)
            positions = torch.arange(n, device=self.device)
            rope, slots = self._rope_tables(positions), self.base[b] + positions
            x = t.embed[ids]
            for blk, planes in zip(t.layers, self.target_kv):
                x = self._block(blk, planes, x, rope, slots, n, None)
            h = _rms(x, t.norm, s.eps)
            nxt = F.linear(h[-1:], t.lm_head).float().argmax(-1)
            self.tok[b], self.pos[b] = nxt[0], n
            self.out[b, 0], self.out_len[b] = nxt[0], 1  # the prompt's next token, as prefill yields it
            if d is None:
                continue
            following = torch.cat((ids[1:], nxt))  # the token after each prompt position
            self.hidden[b] = self._draft_rows(h, following, positions, slots, n, None)[-1]
        if d is not None:
            self._first_drafts(self.hidden)

    def _first_drafts(self, out: torch.Tensor) -> None:
        """Draft step 1 from the draft's output at the newest verified position (out [B, H]): its greedy token
        (chain), or its topk tokens by probability (tree), which start the kept paths and the candidates."""
        logits = F.linear(out, self.target.lm_head).float()
        if self.topk == 1:
            self.drafts[:, 0] = logits.argmax(-1)
            self.hidden.copy_(out)
            return
        k = self.topk
        score, token = torch.softmax(logits, -1).topk(k, -1)
        self.score.copy_(score)
        self.branch_tok.copy_(token)
        self.paths.fill_(-1)
        self.paths[:, :, 0] = token
        self.branch_hidden.copy_(out[:, None].expand(-1, k, -1))
        self.cand_score[:, :k] = score
        self.cand_paths[:, :k] = self.paths

    # ---------------------------------------------------------------------------------------------- stages
    def _emit(self, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Append tokens [B, w] (the first count[b] of them valid) to out at out_len; the others are overwritten
        by the next ones. Past capacity tokens, a request's are dropped (out_len stops there)."""
        cols = self.out_len[:, None] + torch.arange(tokens.shape[1], device=self.device)
        self.out.scatter_(1, cols, tokens)
        self.out_len.add_(count).clamp_(max=self.capacity)

    def decode_stage(self) -> None:
        """Plain decoding: one target step per request."""
        greedy, _ = self.target_forward(self.tok, self.pos, 1)
        live = (self.out_len < self.capacity).long()  # a request with capacity tokens stays where it is
        self.tok.copy_(greedy[:, 0])
        self.pos.add_(live)
        self._emit(greedy, live)

    def draft_stage(self) -> None:
        """Draft steps 2..k: one row per request (chain), or one per kept path (tree: topk rows per request, each
        over the request's draft KV and its own slots of the earlier steps; the topk best of the topk x topk
        extensions by path probability are kept, and every extension is a candidate)."""
        if self.topk > 1:
            return self._tree_draft_stage()
        for i in range(1, self.steps):
            greedy, out = self.draft_forward(self.hidden, self.drafts[:, i - 1], self.pos + (i - 1), 1)
            self.drafts[:, i] = greedy[:, 0]
            self.hidden.copy_(out[:, 0])

    def _tree_draft_stage(self) -> None:
        b, k, steps, h = self.batch, self.topk, self.steps, self.shape.hidden
        rows = torch.arange(b * k, device=self.device)
        prefix = self.pos.repeat_interleave(k)
        own_base = self.scratch + rows * steps
        for i in range(steps - 1):  # step i + 2, at position pos + i
            index = self._branch_index(prefix, self.base.repeat_interleave(k), own_base, i + 1)
            out = self._draft_rows(self.branch_hidden.view(-1, h), self.branch_tok.view(-1), prefix + i,
                                   own_base + i, 1, index)
            p, token = torch.softmax(F.linear(out, self.target.lm_head).float(), -1).topk(k, -1)
            extended = (self.score[:, :, None] * p.view(b, k, k)).view(b, k * k)
            paths = self.paths[:, :, None, :].expand(b, k, k, steps).clone()
            paths[:, :, :, i + 1] = token.view(b, k, k)
            paths = paths.view(b, k * k, steps)
            first = k + i * k * k
            self.cand_score[:, first:first + k * k] = extended
            self.cand_paths[:, first:first + k * k] = paths
            best_score, best = extended.topk(k, -1)
            self.score.copy_(best_score)
            self.branch_tok.copy_(token.view(b, k * k).gather(1, best))
            self.paths.copy_(paths.gather(1, best[:, :, None].expand(-1, -1, steps)))
            self.branch_hidden.copy_(out.view(b, k, h).gather(1, (best // k)[:, :, None].expand(-1, -1, h)))

    def verify_stage(self) -> None:
        """The target over [tok, d_1 .. d_k] (chain) or [tok, the k candidates of highest path probability] with
        their tree mask; the accepted count; the round's tokens appended to out."""
        if self.topk > 1:
            return self._tree_verify_stage()
        k = self.steps
        tokens = torch.cat((self.tok[:, None], self.drafts), 1).reshape(-1)
        greedy, h = self.target_forward(tokens, self.pos, k + 1)
        m = (self.drafts == greedy[:, :k]).long().cumprod(-1).sum(-1)
        self._accept(greedy, h, m, None)

    def _accept(self, greedy: torch.Tensor, h: torch.Tensor, m: torch.Tensor, order: torch.Tensor | None) -> None:
        """Keep the verified rows on the accepted path in order (order [B, k + 1]; None: as they are) for the draft
        extend, append their tokens (the first m + 1) to out, log the round."""
        if order is not None:
            greedy = greedy.gather(1, order)
            h = h.gather(1, order[:, :, None].expand(-1, -1, h.shape[-1]))
        live = (self.out_len < self.capacity).long()  # a request with capacity tokens stays where it is
        self.verified.copy_(greedy)
        self.verified_hidden.copy_(h)
        self.accepted.copy_(m * live + (live - 1))  # -1: frozen
        self._emit(greedy, (m + 1) * live)
        self.log.scatter_(1, self.rounds[:, None], (m + 1)[:, None])
        self.rounds.add_(live)

    def _tree_verify_stage(self) -> None:
        b, n, steps = self.batch, self.steps, self.steps  # n: verified drafts (num_draft_tokens - 1)
        chosen = self.cand_score.topk(n, -1).indices  # [B, n]; a parent scores at least its children
        paths = self.cand_paths.gather(1, chosen[:, :, None].expand(-1, -1, steps))  # [B, n, steps]
        depth = self.cand_depth[chosen]  # [B, n]
        node_tok = paths.gather(2, (depth - 1)[:, :, None])[:, :, 0]
        # anc[b, i, j]: node j lies on node i's path (a proper ancestor)
        at = torch.arange(steps, device=self.device)
        same = (paths[:, :, None, :] == paths[:, None, :, :]) | (at >= depth[:, None, :, None])
        anc = same.all(-1) & (depth[:, None, :] < depth[:, :, None])
        mask = torch.zeros(b, n + 1, n + 1, dtype=torch.bool, device=self.device)
        mask[:, :, 0] = True
        mask[:, 1:, 1:] = anc | torch.eye(n, dtype=torch.bool, device=self.device)
        zero = torch.zeros(b, 1, dtype=torch.long, device=self.device)
        positions = (self.pos[:, None] + torch.cat((zero, depth), 1)).reshape(-1)
        tokens = torch.cat((self.tok[:, None], node_tok), 1).reshape(-1)
        greedy, h = self.target_forward(tokens, self.pos, n + 1, positions=positions, tree_mask=mask)
        # a node is accepted when its token is its parent's greedy token and its parent is accepted
        parent = (anc & (depth[:, None, :] == depth[:, :, None] - 1)).long().argmax(-1)  # [B, n]
        first = depth == 1
        g_parent = torch.where(first, greedy[:, :1], greedy[:, 1:].gather(1, parent))
        match = node_tok == g_parent
        ok = match & first
        for _ in range(steps - 1):
            ok = match & (first | ok.gather(1, parent))
        reach = depth * ok
        m, last = reach.max(-1)  # accepted drafts; the deepest accepted node
        on_path = anc.gather(1, last[:, None, None].expand(-1, 1, n))[:, 0] | (at[:n] == last[:, None])
        d = torch.arange(1, steps + 1, device=self.device)
        at_depth = on_path[:, None, :] & (depth[:, None, :] == d[None, :, None])  # [B, steps, n]
        row = torch.where(d[None] <= m[:, None], 1 + at_depth.long().argmax(-1), 0)  # verify row of each depth
        order = torch.cat((zero, row), 1)
        # the accepted nodes' K/V to the slots of their positions (pos + depth), every layer in one copy a plane
        base = self.base[:, None] + self.pos[:, None]
        dst = base + d[None]
        src = torch.where(row > 0, base + row, dst)
        layers = len(self.target_kv)
        for plane in self.target_planes.values():
            view = plane.view(layers, self.slots, *plane.shape[1:])
            view[:, dst.reshape(-1)] = view[:, src.reshape(-1)]
        self._accept(greedy, h, m, order)

    def extend_stage(self) -> None:
        """The draft over the verified rows; the next round's first draft from row m; tok, pos advanced."""
        k = self.steps
        positions = self._positions(self.pos, k + 1)
        out = self._draft_rows(self.verified_hidden.reshape(-1, self.shape.hidden), self.verified.reshape(-1),
                               positions, self._slots(positions, k + 1), k + 1, self._stage_index(self.pos, k + 1))
        m = self.accepted.clamp(min=0)
        rows = torch.arange(self.batch, device=self.device)
        self._first_drafts(out.view(self.batch, k + 1, -1)[rows, m])
        self.tok.copy_(self.verified[rows, m])
        self.pos.add_(self.accepted + 1)  # frozen (-1): stays

    def spec_round(self) -> None:
        self.draft_stage()
        self.verify_stage()
        self.extend_stage()

    # ---------------------------------------------------------------------------------------------- graphs
    def stage(self, name: str):
        """A callable running stage `name` ("decode", "draft", "verify", "extend"): its CUDA graph's replay on a
        GPU (captured on first use, after one eager run that also compiles the kernels: the state moves on by
        that run, so capture before prefill), the eager stage elsewhere."""
        fn = getattr(self, f"{name}_stage")
        if not self.device.type == "cuda":
            return fn
        if name not in self._graphs:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.no_grad():
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                fn()
            self._graphs[name] = graph
        return self._graphs[name].replay

    def capture(self, spec: bool) -> None:
        """Capture the stages a run needs (on a GPU; nothing elsewhere). Runs each stage twice on whatever state
        is there: prefill afterwards."""
        for name in (("draft", "verify", "extend") if spec else ("decode",)):
            self.pos.fill_(1)  # every stage's rows in range, whatever the previous one did
            self.out_len.zero_()
            self.rounds.zero_()
            self.stage(name)

    @torch.no_grad()
    def decode(self, new_tokens: int, spec: bool, check_every: int = 8) -> int:
        """After prefill: plain steps, or NEXTN rounds (spec), until every request has new_tokens tokens (at most
        capacity; rounds run in groups of check_every, after each of which the host reads the lengths: one device
        synchronisation). Returns the steps or rounds run."""
        if spec and self.draft is None:
            raise ValueError("spec=True needs draft weights")
        if new_tokens > self.capacity:
            raise ValueError(f"new_tokens {new_tokens} > capacity {self.capacity}")
        stages = [self.stage(n) for n in (("draft", "verify", "extend") if spec else ("decode",))]
        done = 0
        while True:
            for _ in range(check_every):
                for run in stages:
                    run()
            done += check_every
            if bool((self.out_len >= new_tokens).all()):
                return done

    def results(self, new_tokens: int) -> dict:
        """Per request: its first new_tokens tokens, and (after spec rounds) the accept length of each round up to
        the one that reached new_tokens."""
        tokens = self.out[:, :new_tokens].cpu().tolist()
        log, rounds = self.log.cpu(), self.rounds.cpu()
        accept = []
        for b in range(self.batch):
            lengths = log[b, :int(rounds[b])].tolist()
            total, kept = 0, []
            for n in lengths:
                if total >= new_tokens:
                    break
                kept.append(n)
                total += n
            accept.append(kept)
        return {"tokens": tokens, "accept": accept}
