"""The NEXTN loop without SGLang (tools/native_loop.py) on a tiny random Llama with head_dim 64, float32,
our kernels under the Triton interpreter: its speculative rounds give the tokens of plain greedy decoding, and
each round's accept length is the one draft_acceptance's simulation (what train-draft reports) finds for the same
position of the same continuation."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tools.draft_training.draft_acceptance import (
    accept_length,
    chain_drafts,
    decode_walk,
    tree_accept_length,
    tree_drafts,
)
from tools.draft_training.draft_corpus import Sequence
from tools.draft_training.mtp_layer import MtpLayer
from tools.draft_training.train_draft import linear_start
from tools.native_loop import DraftWeights, NativeNextn, TargetWeights

# vocab 12 and an untied lm_head: the random target's greedy continuations then wander over the vocabulary
CONFIG = {
    "hidden_size": 128, "intermediate_size": 192, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "vocab_size": 12, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "max_position_embeddings": 256,
}
PROMPTS = [[1, 5, 3, 7, 2], [4, 4, 9, 0, 11, 6, 2, 8, 1]]
NEW = 24


def _sequence(hf, prompt: list[int], new: int) -> Sequence:
    """HF's greedy continuation of prompt, with its hidden states after the final norm and greedy tokens."""
    ids = torch.tensor([prompt])
    ids = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)[0]
    out = hf(ids[None], output_hidden_states=True)
    return Sequence(ids, out.hidden_states[-1][0], out.logits[0].argmax(-1), prompt_len=len(prompt))


@pytest.fixture(scope="module")
@torch.no_grad()
def models():
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="eager")).eval()
    for p in hf.parameters():  # larger weights than the default init, and logits 20x theirs: no near-ties
        if p.dim() == 2:
            p.mul_(4.0)
    hf.model.norm.weight.mul_(20.0)
    hf.generation_config.eos_token_id = None  # generate NEW tokens whatever they are
    hf.generation_config.pad_token_id = 0
    # a draft that is right often enough for rounds of every length: train-draft's closed-form linear start from
    # 48 continuations, with its attention and MLP branches put back at 0.3 of their random init so that the
    # draft's KV still matters
    mtp = MtpLayer(CONFIG).eval()
    branches = mtp.self_attn.o_proj.weight.clone(), mtp.mlp.down_proj.weight.clone()
    g = torch.Generator().manual_seed(1)
    corpus = [_sequence(hf, torch.randint(0, 12, (6,), generator=g).tolist(), NEW) for _ in range(48)]
    linear_start(mtp, hf.model.embed_tokens.weight, corpus, 1e-3)
    mtp.self_attn.o_proj.weight.copy_(0.3 * branches[0])
    mtp.mlp.down_proj.weight.copy_(0.3 * branches[1])
    return hf, mtp


def _loop(models, fmt, batch_prompts, topk=1):
    hf, mtp = models
    target = TargetWeights(hf.state_dict(), CONFIG, torch.float32, "cpu")
    draft = DraftWeights(mtp.state_dict(), torch.float32, "cpu")
    return NativeNextn(target, draft, fmt, batch=len(batch_prompts), max_ctx=64, steps=3, capacity=32, topk=topk)


def _reference(models, prompt):
    """_sequence's continuation of `prompt`, and how many of its tokens come with a clear margin (top logit over
    the second by more than 0.2: our pools round K/V, so a closer pair may flip, as in SGLang's pools)."""
    with torch.no_grad():
        seq = _sequence(models[0], prompt, NEW)
        logits = models[0](seq.tokens[None]).logits[0, len(prompt) - 1:-1]
    top = logits.topk(2, -1).values
    close = ((top[:, 0] - top[:, 1]) < 0.2).nonzero()
    return seq, int(close[0, 0]) if len(close) else NEW


def _simulated_rounds(models, seq, clear, steps=3, topk=1):
    """draft_acceptance's accept lengths along seq's continuation (chain, or tree drafts of topk with `steps`
    verified drafts), the rounds whose verified tokens all lie within its first `clear` tokens."""
    mtp, embed, head = models[1], models[0].model.embed_tokens.weight.detach(), models[0].lm_head.weight.detach()
    last = min(len(seq.tokens) - 1, seq.prompt_len + clear - 1) - steps
    ts = torch.arange(seq.prompt_len - 1, last + 1)
    targets = torch.stack([seq.greedy[ts + s] for s in range(1, steps + 1)], dim=-1)
    if topk == 1:
        return decode_walk(accept_length(chain_drafts(mtp, embed, head, seq, steps)[ts], targets).tolist())
    paths, depths = tree_drafts(mtp, embed, head, seq, steps, topk, steps + 1)
    return decode_walk(tree_accept_length(paths[ts], depths[ts], targets).tolist())


@pytest.mark.parametrize("fmt", ["bf16", "octave_k3v4"])
def test_rounds_give_plain_decoding_tokens_and_the_simulated_accept_lengths(models, fmt):
    loop = _loop(models, fmt, PROMPTS)
    loop.prefill(PROMPTS)
    loop.decode(NEW, spec=False, check_every=4)
    plain = loop.results(NEW)["tokens"]
    loop.prefill(PROMPTS)
    rounds = loop.decode(NEW, spec=True, check_every=2)
    spec = loop.results(NEW)
    assert spec["tokens"] == plain
    assert rounds < NEW  # fewer rounds than tokens: some drafts were accepted
    assert any(n > 1 for a in spec["accept"] for n in a)
    for accepted in spec["accept"]:
        assert sum(accepted) >= NEW - 1  # the first token comes from prefill
    if fmt != "bf16":  # octave's K/V error moves this sharp tiny model off HF's float32 tokens within a few
        return
    compared = 0
    for prompt, tokens, accepted in zip(PROMPTS, plain, spec["accept"]):
        seq, clear = _reference(models, prompt)
        assert tokens[:clear] == seq.tokens[len(prompt):len(prompt) + clear].tolist()
        simulated = _simulated_rounds(models, seq, clear)
        assert accepted[:len(simulated)] == simulated
        compared += len(simulated)
    assert compared >= 16, compared
    assert sum(n > 2 for a in spec["accept"] for n in a) >= 2


def test_tree_rounds_give_plain_decoding_tokens_and_the_simulated_accept_lengths(models):
    """topk 4, 3 verified drafts (`--speculative-eagle-topk 4 --speculative-num-draft-tokens 4`), bf16 pool: the
    tree verify's tokens are plain decoding's and its rounds draft_acceptance's tree simulation's, with rounds whose
    accepted node was not the first verified one (its K/V moved to its position's slot) among them. This draft's
    probabilities are flat, so the tree verifies several first tokens and accepts at most one draft a round."""
    loop = _loop(models, "bf16", PROMPTS, topk=4)
    loop.prefill(PROMPTS)
    loop.decode(NEW, spec=False, check_every=4)
    plain = loop.results(NEW)["tokens"]
    moved = []  # rounds whose accepted depth-1 node was not verify row 1: its K/V had to move
    accept = loop._accept

    def spy(greedy, h, m, order):
        moved.append(int(((m > 0) & (order[:, 1] != 1)).sum()))
        accept(greedy, h, m, order)
    loop._accept = spy
    loop.prefill(PROMPTS)
    loop.decode(NEW, spec=True, check_every=2)
    tree = loop.results(NEW)
    assert tree["tokens"] == plain
    assert sum(moved) >= 2, moved
    compared = 0
    for prompt, accepted in zip(PROMPTS, tree["accept"]):
        seq, clear = _reference(models, prompt)
        simulated = _simulated_rounds(models, seq, clear, topk=4)
        assert accepted[:len(simulated)] == simulated
        compared += len(simulated)
    assert compared >= 12, compared
    assert sum(n > 1 for a in tree["accept"] for n in a) >= 12


def test_a_prompt_too_long_for_the_pool_is_refused(models):
    loop = _loop(models, "bf16", [[1] * 30])
    with pytest.raises(ValueError, match="leaves room for 1..24"):
        loop.prefill([[1] * 30])
