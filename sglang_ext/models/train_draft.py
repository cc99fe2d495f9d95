"""`train-draft`: train the MiMo MTP draft layer of the built-in model on CPU from its own generated text.

Time-budgeted phases: a training corpus of greedy and sampled continuations (until `corpus_share` of the
budget; the fixed held-out prompts are continued greedily in the first batch), training (until
`train_end_share`), then the checkpoint and the acceptance measured on it. The MTP layer starts from `fixed_seed_mtp_weights` (the base model's last
layer); embeddings and lm_head are the base model's, frozen, as NEXTN shares them with the target.
"""

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_ext.env import ext_home
from sglang_ext.models.builtin import DEFAULT_MODEL_NAME, ModelPrepareError, default_model_dir
from sglang_ext.models.draft_acceptance import measure
from sglang_ext.models.draft_corpus import HELDOUT_TOPICS, TRAIN_TOPICS, Sequence, generate, prompts
from sglang_ext.models.mtp_checkpoint import (
    fixed_seed_mtp_weights,
    load_config,
    load_mtp_weights,
    write_mtp_checkpoint,
)
from sglang_ext.models.mtp_layer import MtpLayer

# The MTP output is also pulled towards the target's hidden state at t+1 (relative squared error): that is
# the state whose lm_head logits are the target's distribution for token t+2, and draft steps 2..k feed the MTP
# output back in where step 1 feeds a target hidden state.
HIDDEN_MATCH_WEIGHT = 1.0


def default_draft_dir() -> Path:
    return ext_home() / "models" / f"{DEFAULT_MODEL_NAME}-MTP"


@dataclass
class DraftTrainConfig:
    minutes: float = 20.0
    heldout_prompts: int = 16  # generated greedily in the same batch as the first corpus batch
    new_tokens: int = 96
    # Large batches: generation time on a CPU is dominated by per-step overhead, not by the batch size.
    corpus_batch_prompts: int = 48
    corpus_share: float = 0.4  # of the budget, held-out generation included; at least one batch is generated
    train_end_share: float = 0.93  # training stops here; the rest is the acceptance measurement and the writer
    batch_sequences: int = 8
    lr: float = 1e-3
    warmup_steps: int = 10
    ce_fraction: float = 0.25  # share of positions whose cross-entropy is computed each step (the lm_head product
    #                            dominates the cost of a step); the hidden match covers every position
    sample_temperature: float = 0.8  # every other corpus batch is sampled, the others greedy
    draft_steps: int = 3
    seed: int = 0
    max_corpus_batches: int | None = None  # None: as many as the time allows
    max_train_steps: int | None = None

    def __post_init__(self):
        if self.minutes <= 0:
            raise ValueError(f"minutes must be positive, got {self.minutes}")
        if not 0 < self.corpus_share < self.train_end_share <= 1:
            raise ValueError("need 0 < corpus_share < train_end_share <= 1")
        if self.draft_steps < 1:
            raise ValueError("draft_steps must be at least 1")


@dataclass
class DraftTrainResult:
    out_dir: str
    corpus_sequences: int
    corpus_tokens: int
    train_steps: int
    loss_first: float  # mean cross-entropy over the first 10 % of steps
    loss_last: float  # ... and over the last 10 %
    before: dict  # Acceptance of the untrained layer on the held-out prompts
    after: dict
    seconds: dict = field(default_factory=dict)


def collate(sequences: list[Sequence]) -> dict[str, torch.Tensor]:
    """Right-pad a batch. `target_mask[b, t]`: the output at t predicts a continuation token t+2 of sequence b."""
    length = max(len(s.tokens) for s in sequences)
    hidden_size = sequences[0].hidden.shape[-1]
    tokens = torch.zeros(len(sequences), length, dtype=torch.long)
    hidden = torch.zeros(len(sequences), length, hidden_size)
    target_mask = torch.zeros(len(sequences), length - 2, dtype=torch.bool)
    for b, s in enumerate(sequences):
        n = len(s.tokens)
        tokens[b, :n], hidden[b, :n] = s.tokens, s.hidden
        target_mask[b, max(s.prompt_len - 2, 0):n - 2] = True
    return {"tokens": tokens, "hidden": hidden, "target_mask": target_mask}


def mtp_loss(mtp: MtpLayer, embed: torch.Tensor, lm_head: torch.Tensor, batch: dict, ce_fraction: float = 1.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy on token t+2 over a random `ce_fraction` of the target_mask positions, at least one;
    relative squared error to the target hidden at t+1 over all of them)."""
    tokens, hidden, mask = batch["tokens"], batch["hidden"], batch["target_mask"]
    length = tokens.shape[1]
    positions = torch.arange(length - 1).expand(tokens.shape[0], -1)
    out, _ = mtp(hidden[:, :-1], embed[tokens[:, 1:]], positions)
    selected = out[:, :-1][mask]  # [N, H]: outputs whose token t+2 is a continuation token
    n = selected.shape[0]
    rows = torch.randperm(n, generator=generator)[:max(1, round(n * ce_fraction))] if ce_fraction < 1 else slice(None)
    ce = F.cross_entropy(selected[rows] @ lm_head.T, tokens[:, 2:][mask][rows])
    target_hidden = hidden[:, 1:-1][mask]
    hidden_err = (selected - target_hidden).pow(2).mean() / target_hidden.pow(2).mean()
    return ce, hidden_err


def load_base(base_dir: Path):
    if not (base_dir / "config.json").is_file():
        raise ModelPrepareError(f"no model in {base_dir}: run `python -m sglang_ext.models prepare` first")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(base_dir)


def train_draft(config: DraftTrainConfig, base_dir=None, out_dir=None, log=print) -> DraftTrainResult:
    """Run every phase and write the checkpoint to `out_dir` (default: default_draft_dir())."""
    base_dir = Path(base_dir) if base_dir is not None else default_model_dir()
    out_dir = Path(out_dir) if out_dir is not None else default_draft_dir()
    budget = config.minutes * 60
    start = time.monotonic()
    elapsed = lambda: time.monotonic() - start  # noqa: E731
    seconds = {}

    model, tokenizer = load_base(base_dir)
    model_config = load_config(base_dir)
    embed = model.get_input_embeddings().weight.detach()
    lm_head = model.get_output_embeddings().weight.detach()
    log(f"[train-draft] loaded {base_dir} in {elapsed():.0f} s; budget {config.minutes:g} min")

    heldout_prompts = prompts(HELDOUT_TOPICS, tokenizer, config.heldout_prompts, config.seed)
    train_prompts = prompts(TRAIN_TOPICS, tokenizer, len(TRAIN_TOPICS) * 11, config.seed)
    heldout: list[Sequence] = []
    corpus: list[Sequence] = []
    batch_index = 0
    while (batch_index == 0 or elapsed() < config.corpus_share * budget) and \
            (batch_index + 1) * config.corpus_batch_prompts <= len(train_prompts):
        if config.max_corpus_batches is not None and batch_index >= config.max_corpus_batches:
            break
        chunk = train_prompts[batch_index * config.corpus_batch_prompts:(batch_index + 1) * config.corpus_batch_prompts]
        temperature = config.sample_temperature if batch_index % 2 else 0.0
        if batch_index == 0:  # the held-out prompts ride along with the first (greedy) batch
            chunk = heldout_prompts + chunk
        generated = generate(model, tokenizer, chunk, config.new_tokens, temperature, seed=config.seed + batch_index)
        if batch_index == 0:
            heldout = [s for s in generated[:len(heldout_prompts)] if s is not None]
            generated = generated[len(heldout_prompts):]
        corpus += [s for s in generated if s is not None]
        batch_index += 1
        tokens = sum(len(s.tokens) for s in corpus)
        log(f"[train-draft] corpus: {len(corpus)} sequences, {tokens} tokens; held-out: {len(heldout)} "
            f"greedy continuations ({elapsed():.0f} s)")
    if not corpus:
        raise RuntimeError("the corpus is empty: every generated continuation was shorter than 4 tokens")
    seconds["corpus"] = elapsed()
    del model

    mtp = MtpLayer(model_config)
    mtp.load_state_dict(fixed_seed_mtp_weights(base_dir, config.seed))
    before = measure(mtp.eval(), embed, lm_head, heldout, config.draft_steps)
    log(f"[train-draft] untrained layer: accept length {before.mean_accept_length:.3f} "
        f"with {config.draft_steps} draft tokens ({elapsed():.0f} s)")

    optimizer = torch.optim.AdamW(mtp.parameters(), lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    order: list[int] = []
    losses = []
    train_start = elapsed()
    train_budget = config.train_end_share * budget - train_start
    mtp.train()
    step = 0
    while elapsed() < config.train_end_share * budget or step == 0:
        if config.max_train_steps is not None and step >= config.max_train_steps:
            break
        if len(order) < config.batch_sequences:
            order += rng.sample(range(len(corpus)), len(corpus))
        batch = collate([corpus[i] for i in order[:config.batch_sequences]])
        del order[:config.batch_sequences]
        progress = min((elapsed() - train_start) / max(train_budget, 1e-9), 1.0)
        lr = config.lr * min(1.0, (step + 1) / config.warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        ce, hidden_err = mtp_loss(mtp, embed, lm_head, batch, config.ce_fraction, generator)
        optimizer.zero_grad()
        (ce + HIDDEN_MATCH_WEIGHT * hidden_err).backward()
        optimizer.step()
        losses.append(ce.item())
        step += 1
        if step % 10 == 0 or step == 1:
            recent = losses[-10:]
            log(f"[train-draft] step {step}: loss {sum(recent) / len(recent):.3f} (hidden err {hidden_err.item():.3f}, "
                f"lr {lr:.2e}, {elapsed():.0f} s)")
    seconds["train"] = elapsed()

    write_mtp_checkpoint(base_dir, out_dir, {k: v.detach() for k, v in mtp.state_dict().items()})
    stored = MtpLayer(model_config)  # measured as written: the checkpoint stores the base dtype
    stored.load_state_dict(load_mtp_weights(out_dir))
    after = measure(stored.eval(), embed, lm_head, heldout, config.draft_steps)
    log(f"[train-draft] trained layer: accept length {after.mean_accept_length:.3f} with {config.draft_steps} draft "
        f"tokens over {after.rounds} verify rounds; draft prefix match per step {_fmt(after.per_step_match)}")
    seconds["total"] = elapsed()
    tenth = max(len(losses) // 10, 1)
    result = DraftTrainResult(
        out_dir=str(out_dir),
        corpus_sequences=len(corpus),
        corpus_tokens=sum(len(s.tokens) for s in corpus),
        train_steps=step,
        loss_first=sum(losses[:tenth]) / tenth,
        loss_last=sum(losses[-tenth:]) / tenth,
        before=asdict(before),
        after=asdict(after),
        seconds={k: round(v, 1) for k, v in seconds.items()},
    )
    (out_dir / "draft-training.json").write_text(json.dumps({"config": asdict(config), "result": asdict(result)}, indent=2))
    return result


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


__all__ = ["DraftTrainConfig", "DraftTrainResult", "default_draft_dir", "train_draft"]
