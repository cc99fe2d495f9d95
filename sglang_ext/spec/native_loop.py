"""NEXTN speculative decoding without SGLang: a Llama-shaped target and one MTP layer over KV pool planes of our
formats, through our store / decode / extend kernels. Every step has fixed shapes, so on a GPU each stage is one
CUDA-graph replay and no stage waits for the host.

What it is for: SGLang does not run on the lent H200, so the net decode speed-up of NEXTN over our kernels is
measured with this loop (benchmarks/spec_gpu_loop.py) on the built-in model and a train-draft checkpoint. It does
what SGLang's EAGLE worker does for `--speculative-algorithm NEXTN --speculative-num-steps k
--speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`, greedy, with no scheduler and no sampling. Core
code: no SGLang import.

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

The draft tokens match what `sglang_ext.models.draft_acceptance.chain_drafts` simulates (that simulation is what
train-draft reports); `tests/spec/test_native_loop.py` checks the loop against the plain decode loop and the
simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sglang_ext import kernels
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
    """One MTP layer (sglang_ext.models.mtp_layer.MtpLayer's parameter names)."""

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
                 steps: int = 3, capacity: int = 256):
        s = self.shape = target.shape
        self.target, self.draft, self.steps = target, draft, steps
        self.batch, self.max_ctx = batch, max_ctx
        dev = self.device = target.embed.device
        self.dtype = target.embed.dtype
        self.fmt = get_format(fmt_name, head_dim=s.head_dim)
        slots = batch * max_ctx
        self.target_kv = [self.fmt.allocate(slots, s.kv_heads, dev) for _ in target.layers]
        self.draft_kv = self.fmt.allocate(slots, s.kv_heads, dev) if draft is not None else None
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
               index) -> torch.Tensor:
        """x [B * q_len, H] (request-major) at the rows' positions (rope: their tables; slots: their pool slots):
        attention over the pool, each row's K/V stored at its slot first. q_len 1: decode (the prefix includes the
        row itself); > 1: verify / extend split over the prefix (index: the prefix), token j seeing the new tokens
        0..j."""
        s = self.shape
        qkv = F.linear(_rms(x, blk.ln1, s.eps), blk.qkv, blk.qkv_bias)
        qk, v = qkv.split([(s.heads + s.kv_heads) * s.head_dim, s.kv_heads * s.head_dim], -1)
        qk = self._rope(qk.view(-1, s.heads + s.kv_heads, s.head_dim), rope)
        q, k = qk[:, :s.heads].contiguous(), qk[:, s.heads:].contiguous()
        v = v.reshape(-1, s.kv_heads, s.head_dim).contiguous()
        kernels.store_kv(self.fmt, planes, slots, k, v)
        o = torch.empty_like(q)
        indptr, indices = index
        if q_len == 1:
            kernels.decode_attention(self.fmt, q, planes, o, indptr, indices, self.scale)
        else:
            kernels.decode_attention(self.fmt, q, planes, o, indptr, indices, self.scale, q_len=q_len,
                                     new_slots=slots)
        x = _linear_add(x, o.view(x.shape[0], -1), blk.o)
        gate, up = F.linear(_rms(x, blk.ln2, s.eps), blk.gate_up).chunk(2, -1)
        return _linear_add(x, F.silu(gate) * up, blk.down)

    def _positions(self, start: torch.Tensor, q_len: int) -> torch.Tensor:
        return (start[:, None] + torch.arange(q_len, device=self.device)).reshape(-1)

    def _slots(self, positions: torch.Tensor, q_len: int) -> torch.Tensor:
        return self.base.repeat_interleave(q_len) + positions

    def _stage_index(self, start: torch.Tensor, q_len: int):
        """The attention index of a stage whose rows sit at start .. start + q_len - 1."""
        return self._index(start + 1 if q_len == 1 else start)

    def target_forward(self, tokens: torch.Tensor, start: torch.Tensor, q_len: int):
        """tokens [B * q_len] at positions start[b] + j -> (greedy next tokens [B, q_len], hidden states after the
        final norm [B, q_len, H])."""
        t = self.target
        positions = self._positions(start, q_len)
        rope, slots = self._rope_tables(positions), self._slots(positions, q_len)
        index = self._stage_index(start, q_len)
        x = t.embed[tokens]
        for blk, planes in zip(t.layers, self.target_kv):
            x = self._block(blk, planes, x, rope, slots, q_len, index)
        h = _rms(x, t.norm, self.shape.eps)
        greedy = F.linear(h, t.lm_head).float().argmax(-1)
        return greedy.view(self.batch, q_len), h.view(self.batch, q_len, -1)

    def draft_forward(self, hidden: torch.Tensor, tokens: torch.Tensor, start: torch.Tensor, q_len: int):
        """The MTP on (hidden [B * q_len, H], token [B * q_len]) at positions start[b] + j -> (greedy tokens
        [B, q_len], outputs after final_layernorm [B, q_len, H])."""
        d, s = self.draft, self.shape
        positions = self._positions(start, q_len)
        e = self.target.embed[tokens] * (positions != 0)[:, None].to(self.dtype)  # MiMoMTP zeroes position 0's
        x = F.linear(torch.cat((_rms(hidden, d.hidden_norm, s.eps), _rms(e, d.token_norm, s.eps)), -1), d.input_proj)
        x = self._block(d.block, self.draft_kv, x, self._rope_tables(positions), self._slots(positions, q_len), q_len,
                        self._stage_index(start, q_len))
        out = _rms(x, d.final_norm, s.eps)
        greedy = F.linear(out, self.target.lm_head).float().argmax(-1)
        return greedy.view(self.batch, q_len), out.view(self.batch, q_len, -1)

    # ---------------------------------------------------------------------------------------------- prefill
    def _prefill_block(self, blk: Block, planes: dict, x: torch.Tensor, b: int) -> torch.Tensor:
        s = self.shape
        n = x.shape[0]
        positions = torch.arange(n, device=self.device)
        qkv = F.linear(_rms(x, blk.ln1, s.eps), blk.qkv, blk.qkv_bias)
        qk, v = qkv.split([(s.heads + s.kv_heads) * s.head_dim, s.kv_heads * s.head_dim], -1)
        qk = self._rope(qk.view(n, s.heads + s.kv_heads, s.head_dim), self._rope_tables(positions))
        q, k = qk[:, :s.heads].contiguous(), qk[:, s.heads:].contiguous()
        v = v.reshape(n, s.kv_heads, s.head_dim).contiguous()
        kernels.store_kv(self.fmt, planes, self.base[b] + positions, k, v)
        o = torch.empty_like(q)
        zero = torch.zeros(2, dtype=torch.int32, device=self.device)
        kernels.extend_attention(self.fmt, q, k, v, o, planes, torch.tensor([0, n], dtype=torch.int32,
                                 device=self.device), zero, zero, n, self.scale)
        x = _linear_add(x, o.view(n, -1), blk.o)
        gate, up = F.linear(_rms(x, blk.ln2, s.eps), blk.gate_up).chunk(2, -1)
        return _linear_add(x, F.silu(gate) * up, blk.down)

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
            x = t.embed[ids]
            for blk, planes in zip(t.layers, self.target_kv):
                x = self._prefill_block(blk, planes, x, b)
            h = _rms(x, t.norm, s.eps)
            nxt = F.linear(h[-1:], t.lm_head).float().argmax(-1)
            self.tok[b], self.pos[b] = nxt[0], n
            self.out[b, 0], self.out_len[b] = nxt[0], 1  # the prompt's next token, as prefill yields it
            if d is None:
                continue
            following = torch.cat((ids[1:], nxt))  # the token after each prompt position
            e = t.embed[following] * (torch.arange(n, device=self.device) != 0)[:, None].to(self.dtype)
            x = F.linear(torch.cat((_rms(h, d.hidden_norm, s.eps), _rms(e, d.token_norm, s.eps)), -1), d.input_proj)
            x = self._prefill_block(d.block, self.draft_kv, x, b)
            out = _rms(x, d.final_norm, s.eps)
            self.hidden[b] = out[-1]
            self.drafts[b, 0] = F.linear(out[-1:], t.lm_head).float().argmax(-1)[0]

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
        """Draft steps 2..k."""
        for i in range(1, self.steps):
            greedy, out = self.draft_forward(self.hidden, self.drafts[:, i - 1], self.pos + (i - 1), 1)
            self.drafts[:, i] = greedy[:, 0]
            self.hidden.copy_(out[:, 0])

    def verify_stage(self) -> None:
        """The target over [tok, d_1 .. d_k]; the accepted count; the round's tokens appended to out."""
        k = self.steps
        tokens = torch.cat((self.tok[:, None], self.drafts), 1).reshape(-1)
        greedy, h = self.target_forward(tokens, self.pos, k + 1)
        m = (self.drafts == greedy[:, :k]).long().cumprod(-1).sum(-1)
        self.verified.copy_(greedy)
        self.verified_hidden.copy_(h)
        live = (self.out_len < self.capacity).long()  # a request with capacity tokens stays where it is
        self.accepted.copy_(m * live + (live - 1))  # -1: frozen
        self._emit(greedy, (m + 1) * live)
        self.log.scatter_(1, self.rounds[:, None], (m + 1)[:, None])
        self.rounds.add_(live)

    def extend_stage(self) -> None:
        """The draft over the verified rows; the next round's first draft from row m; tok, pos advanced."""
        k = self.steps
        greedy, out = self.draft_forward(self.verified_hidden.reshape(-1, self.shape.hidden),
                                         self.verified.reshape(-1), self.pos, k + 1)
        m = self.accepted.clamp(min=0)
        rows = torch.arange(self.batch, device=self.device)
        self.drafts[:, 0] = greedy[rows, m]
        self.hidden.copy_(out[rows, m])
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
