"""`train-draft`: train the MiMo MTP draft layer of the built-in model on CPU from its own generated text.

Time-budgeted phases: the fixed held-out prompts continued greedily in float32 (the dtype the acceptance is
measured against), a training corpus of greedy and sampled continuations generated in batches (until
`corpus_share` of the budget; in bfloat16 where the CPU computes it natively: measured 2.3x the tokens per
second of float32 on the development machine's AMX cores; once every prompt is used, the pool is walked
again with sampling and new seeds), training (until `final_seconds` before the budget's end), the draft's
temperature for tree drafts (fit_temperature, on greedy corpus sequences kept out of training), then the
checkpoint and the acceptance measured on it. The MTP layer starts from
`fixed_seed_mtp_weights` (the base model's last layer) with its input projection fitted in closed form to the
corpus and its two branches zeroed (`linear_start`: a linear draft step 1, accept length about 1.4 before any
update); embeddings and lm_head are the base model's, frozen, as NEXTN shares them with the target. Training first fits draft step 1 alone (`single_step_share` of the training
time: a third of the cost per update, and the measured short runs were short of updates), then unrolls
the draft chain (`draft_loss`: steps 2.. get the layer's own output as their hidden input, as at serving time);
it learns the target's distribution (its TOP_TARGETS most likely tokens, computed once per sequence; batches
cut from length-sorted windows, see batch_order) and keeps the state with the best chain match on a validation
split of the corpus (early stopping against memorising a small corpus).
"""

import copy
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel

from sglang_ext.env import ext_home
from sglang_ext.models.builtin import DEFAULT_MODEL_NAME, ModelPrepareError, default_model_dir
from sglang_ext.models.mtp_checkpoint import (
    fixed_seed_mtp_weights,
    load_config,
    load_mtp_weights,
    write_mtp_checkpoint,
)
from tools.draft_training.draft_acceptance import measure
from tools.draft_training.draft_corpus import HELDOUT_TOPICS, Sequence, generate, prompts, train_prompts
from tools.draft_training.draft_loss import OutputHead, collate, corpus_vocab, top_targets, unrolled_losses
from tools.draft_training.mtp_layer import MtpLayer


def default_draft_dir() -> Path:
    return ext_home() / "models" / f"{DEFAULT_MODEL_NAME}-MTP"


@dataclass
class DraftTrainConfig:
    minutes: float = 20.0
    heldout_prompts: int = 16  # generated greedily in the same batch as the first corpus batch
    new_tokens: int = 128
    # Measured on the 2-core development machine with transformers' generate (bf16, 64 new tokens): 283 tokens/s
    # at 48 prompts a batch, 410 at 128, 294 at 256 (float32: 164 at 48, 176 at 128). With decode_batch (float32,
    # 2-core AVX2 EPYC, 128 new tokens): 116-120 s a batch of 128 (156-165 tokens/s, prompts included); at 256 the
    # first 32 decode steps made 1.15x the tokens/s of 128 (not adopted: a batch is the unit of the time budget).
    corpus_batch_prompts: int = 128
    # "auto": bfloat16 when the CPU has AMX or AVX512-BF16 (torch.cpu.get_capabilities()), else float32. The
    # held-out continuations are always float32.
    corpus_dtype: str = "auto"
    # Training products under torch.autocast in this dtype ("auto": as corpus_dtype; the weights and the
    # optimizer stay float32, the softmaxes float32).
    train_dtype: str = "auto"
    # Of the budget, held-out generation included. The first batch always completes; later ones stop decoding when
    # the share is used up (a batch of 128 prompts: 55-65 s on a 2-core AVX2 machine, float32).
    # 0.6 measured no better (2026-12-03, one 2-core AVX2 host, 20-minute runs: 0.45 made 133k tokens and 5,977
    # updates, held-out 1.766 chain / 1.874 tree on 80 prompts; 0.6 206k and 4,023, 1.754 / 1.868), though on one
    # saved corpus half the text cost 0.09-0.10 and a third less training time only 0.01.
    corpus_share: float = 0.45
    # Training stops this many seconds before the budget's end, kept for the temperature fit, the acceptance
    # measurement (chain and tree) and the checkpoint writer: the last three took 11-29 s in every 20- to 60-minute
    # run on the 2-core hosts (2026-12-01 to 12-03); the fit's three tree measurements on 16 sequences about 20 s
    # in bf16 (AVX512-BF16 EPYC; about 30 in float32). Until 2026-12-03 training stopped at 93 % of the budget,
    # which left 55 s of a 20-minute one unused; 40 s until the fit (2026-12-04).
    final_seconds: float = 70.0
    batch_sequences: int = 4  # small batches, more updates: measured better than 8 and 16 in the same time
    # Share of a batch's start positions (after its shortest prompt) whose draft chains carry an update's loss,
    # drawn afresh each update; every position still gives its keys and values (unrolled_losses' rows). 1.0: all.
    # On a saved 168k-token corpus, 560 s of training each (2-core AVX2, float32): 1.0 / 0.5 / 0.25 / 0.125 made
    # 2,818 / 5,116 / 7,390 / 8,473 updates, held-out chain accept length 1.759 / 1.772 / 1.869 / 1.830 (tree
    # 1.880 / 1.892 / 1.935 / 1.922).
    loss_rows: float = 0.25
    # Batches are cut from windows of this many batches' worth of shuffled sequences, each window sorted by
    # length (less right padding: see batch_order); 1 = no sorting.
    length_bucket_batches: int = 16
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_steps: int = 10
    # Loss weight of draft steps 1..draft_steps (the chain is trained unrolled: see draft_loss); a later step
    # only pays off when the earlier ones were accepted.
    step_weights: tuple[float, ...] = (1.0, 0.6, 0.4)
    hidden_match_weight: float = 1.0
    # Training logits over this many of the training text's most frequent token ids (None: all of them). The
    # lm_head product over them is a large part of an update: at 9,000 ids a one-step update took 139 ms and a
    # three-step one 416, at 4,096 ids 104 and 293 (2-core AMD EPYC, bf16). Acceptance is measured over all.
    vocab_limit: int | None = 4096
    # Start from the least-squares linear draft (linear_start) instead of the base model's last layer; 0 = off.
    # The value is the ridge term, relative to the mean diagonal of the features' Gram matrix.
    linear_start_ridge: float = 1e-3
    # Share of the training time (or of max_train_steps) spent on draft step 1 alone before the unrolled chain:
    # a one-step update costs about a third of a three-step one.
    single_step_share: float = 0.75
    # Every other corpus batch is sampled, the others greedy. All greedy (on the first pass over the prompts)
    # measured +0.02 chain and tree on 80 held-out prompts in one paired run (2026-12-03) and was not confirmed by
    # a second seed: not adopted (the raw runs are in git history).
    sample_temperature: float = 0.8
    draft_steps: int = 3
    # The trained layer's acceptance is also measured with tree drafts of the same draft_steps verified tokens
    # (`--speculative-eagle-topk tree_topk --speculative-num-draft-tokens draft_steps + 1`); 0: chain only.
    tree_topk: int = 4
    # The draft's softmax temperature for tree drafting, fitted after training: the candidate whose tree accept
    # length (expected per verified position, config.tree_topk) is highest on `temperature_sequences` greedy corpus
    # sequences kept out of training and validation is baked into the checkpoint as final_layernorm.weight / T.
    # That scales the draft logits by 1 / T and leaves chain drafts as they were (argmax; the next draft step reads
    # the output through hidden_layernorm, an RMSNorm). The layer is trained on soft targets but verified by
    # argmax: on 80 held-out prompts (2026-12-04, one checkpoint) T 0.7 / 0.9 / 1.0 / 1.1 / 1.4 gave tree accept
    # 1.998 / 2.022 / 2.006 / 1.987 / 1.905. One candidate: that T (measured); (), tree_topk <= 1 or
    # temperature_sequences 0: no fit (T = 1).
    tree_temperatures: tuple[float, ...] = (0.8, 0.9, 1.0)
    temperature_sequences: int = 16  # at most a quarter of the first greedy corpus batch
    validation_share: float = 0.08  # corpus sequences kept out of training to pick the best state
    validations: int = 8  # evaluations over the training time; the state with the best chain match is kept
    # Exponential moving average of the weights (torch.optim.swa_utils), evaluated and kept instead of the
    # weights themselves; 0 = off. In one 20-minute run (2026-12-03, 9,135 updates, greedy corpus) the average
    # against the last weights: held-out chain accept 1.906 against 1.886, tree 1.989 against 1.991 (80 prompts).
    ema_decay: float = 0.999
    seed: int = 0
    max_corpus_batches: int | None = None  # None: as many as the time allows
    max_train_steps: int | None = None

    def __post_init__(self):
        if self.minutes <= 0:
            raise ValueError(f"minutes must be positive, got {self.minutes}")
        if not 0 < self.corpus_share < 1:
            raise ValueError(f"corpus_share must be in (0, 1), got {self.corpus_share}")
        if self.final_seconds < 0:
            raise ValueError(f"final_seconds must be >= 0, got {self.final_seconds}")
        if self.corpus_share * self.minutes * 60 >= self.minutes * 60 - self.final_seconds:
            raise ValueError(f"a {self.minutes:g}-minute budget leaves no training time after the corpus "
                             f"({self.corpus_share:.0%}) and the final {self.final_seconds:g} s")
        if self.draft_steps < 1:
            raise ValueError("draft_steps must be at least 1")
        if len(self.step_weights) != self.draft_steps:
            raise ValueError(f"step_weights needs one weight per draft step ({self.draft_steps})")
        if not 0 <= self.single_step_share <= 1:
            raise ValueError("single_step_share must be in [0, 1]")
        if self.linear_start_ridge < 0:
            raise ValueError(f"linear_start_ridge must be >= 0 (0: no linear start), got {self.linear_start_ridge}")
        if self.vocab_limit is not None and self.vocab_limit < 1:
            raise ValueError(f"vocab_limit must be positive or None, got {self.vocab_limit}")
        if self.length_bucket_batches < 1:
            raise ValueError("length_bucket_batches must be at least 1")
        if not 0 < self.loss_rows <= 1:
            raise ValueError(f"loss_rows must be in (0, 1], got {self.loss_rows}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0 <= self.validation_share < 1:
            raise ValueError("validation_share must be in [0, 1)")
        if any(not t > 0 for t in self.tree_temperatures):
            raise ValueError(f"tree_temperatures must be positive, got {self.tree_temperatures}")
        if self.temperature_sequences < 0:
            raise ValueError(f"temperature_sequences must be >= 0, got {self.temperature_sequences}")
        for name in ("corpus_dtype", "train_dtype"):
            if getattr(self, name) not in ("auto", "float32", "bfloat16"):
                raise ValueError(f"{name} must be auto, float32 or bfloat16, got {getattr(self, name)!r}")

    def resolved_corpus_dtype(self) -> torch.dtype:
        return _resolve_dtype(self.corpus_dtype)

    def resolved_train_dtype(self) -> torch.dtype:
        return _resolve_dtype(self.train_dtype)


def _resolve_dtype(choice: str) -> torch.dtype:
    """"auto": bfloat16 where the CPU computes it natively (AMX or AVX512-BF16), else float32."""
    if choice == "auto":
        caps = torch.cpu.get_capabilities()
        return torch.bfloat16 if caps.get("amx_bf16") or caps.get("avx512_bf16") else torch.float32
    return getattr(torch, choice)


@dataclass
class DraftTrainResult:
    out_dir: str
    corpus_sequences: int
    corpus_tokens: int
    train_steps: int
    loss_first: float  # mean draft-1 cross-entropy on the greedy token over the first 10 % of steps
    loss_last: float  # ... and over the last 10 %
    best_step: int  # the step whose state was kept (best validation chain match)
    validation: list  # [step, seconds, teacher-forced prefix match per draft step] per evaluation
    before: dict  # Acceptance of the untrained layer on the held-out prompts
    start: dict | None  # ... of the linear start (None: not used)
    after: dict
    after_tree: dict | None = None  # ... of the trained layer with tree drafts (config.tree_topk)
    # fit_temperature: {"sequences": n, "positions": n, "tree_accept": {T: accept length}, "chosen": T}, or None
    temperature: dict | None = None
    seconds: dict = field(default_factory=dict)


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
    embed = model.get_input_embeddings().weight.detach().clone()  # float32 copies: the model may go to bf16
    lm_head = model.get_output_embeddings().weight.detach().clone()
    log(f"[train-draft] loaded {base_dir} in {elapsed():.0f} s; budget {config.minutes:g} min")

    heldout_prompts = prompts(HELDOUT_TOPICS, tokenizer, config.heldout_prompts, config.seed)
    heldout = [s for s in generate(model, tokenizer, heldout_prompts, config.new_tokens, 0.0, seed=config.seed)
               if s is not None]
    corpus_dtype = config.resolved_corpus_dtype()
    model.to(corpus_dtype)
    log(f"[train-draft] held-out: {len(heldout)} greedy float32 continuations ({elapsed():.0f} s); corpus in "
        f"{str(corpus_dtype).removeprefix('torch.')}")
    pool = train_prompts(tokenizer, config.seed)
    corpus: list[Sequence] = []
    calibration: list[Sequence] = []  # greedy, kept out of training and validation: fit_temperature's text
    fit_t = config.tree_topk > 1 and bool(config.tree_temperatures) and config.temperature_sequences > 0
    batch_index, last_batch = 0, 0.0
    phase_end = config.corpus_share * budget
    while batch_index == 0 or elapsed() < phase_end:
        if config.max_corpus_batches is not None and batch_index >= config.max_corpus_batches:
            break
        if batch_index and not another_corpus_batch(phase_end - elapsed(), last_batch):
            log(f"[train-draft] corpus: {phase_end - elapsed():.0f} s of the phase left, under "
                f"{MIN_BATCH_SHARE:.0%} of a batch ({last_batch:.0f} s): to training instead")
            break
        batch_start = time.monotonic()
        indices, temperature = corpus_batch(batch_index, len(pool), config)
        chunk = [pool[j] for j in indices]
        # every batch after the first stops decoding at the phase's end (shorter continuations, no overrun)
        stop = start + config.corpus_share * budget if batch_index else None
        generated = generate(model, tokenizer, chunk, config.new_tokens, temperature, seed=config.seed + batch_index,
                             deadline=stop)
        generated = [s for s in generated if s is not None]
        if fit_t and temperature == 0.0 and not calibration:
            calibration = generated[:min(config.temperature_sequences, len(generated) // 4)]
            generated = generated[len(calibration):]
        corpus += generated
        batch_index += 1
        last_batch = time.monotonic() - batch_start
        tokens = sum(len(s.tokens) for s in corpus)
        log(f"[train-draft] corpus: {len(corpus)} sequences, {tokens} tokens ({elapsed():.0f} s)")
    if not corpus:
        raise RuntimeError("the corpus is empty: every generated continuation was shorter than 4 tokens")
    seconds["corpus"] = elapsed()
    del model

    rng = random.Random(config.seed)
    shuffled = rng.sample(corpus, len(corpus))
    n_val = min(round(len(corpus) * config.validation_share), 32)
    validation, train = shuffled[:n_val], shuffled[n_val:] or shuffled
    vocab = corpus_vocab(train, config.vocab_limit)
    labels = torch.cat([s.greedy[max(s.prompt_len - 1, 0):] for s in train])
    covered = torch.isin(labels, vocab).float().mean().item()
    log(f"[train-draft] {len(train)} training and {len(validation)} validation sequences; logits over the "
        f"{len(vocab)} most frequent token ids of the training text ({covered:.1%} of its greedy labels)")

    mtp = MtpLayer(model_config)
    mtp.load_state_dict(fixed_seed_mtp_weights(base_dir, config.seed))
    before = measure(mtp.eval(), embed, lm_head, heldout, config.draft_steps)
    log(f"[train-draft] untrained layer: accept length {before.mean_accept_length:.3f} "
        f"with {config.draft_steps} draft tokens ({elapsed():.0f} s)")
    start_acceptance = None
    if config.linear_start_ridge > 0:
        linear_start(mtp, embed, train, config.linear_start_ridge)
        start_acceptance = measure(mtp.eval(), embed, lm_head, heldout, config.draft_steps)
        log(f"[train-draft] linear start: accept length {start_acceptance.mean_accept_length:.3f}, draft prefix "
            f"match per step {_fmt(start_acceptance.per_step_match)} ({elapsed():.0f} s)")
    fit = fit_layer(mtp, embed, lm_head, train, validation, vocab, config,
                    deadline=start + budget - config.final_seconds, rng=rng, log=log)
    seconds["train"] = elapsed()
    losses, step = fit.losses, fit.steps

    temperature = None
    if calibration:
        temperature = fit_temperature(mtp, embed, lm_head, calibration, config)
        with torch.no_grad():
            mtp.final_layernorm.weight.div_(temperature["chosen"])
        log(f"[train-draft] draft temperature for tree drafts: {temperature['chosen']:g} (tree accept length per "
            f"position on {len(calibration)} greedy sequences kept out of training: "
            + ", ".join(f"T {t:g} {a:.4f}" for t, a in temperature["tree_accept"].items()) + f"; {elapsed():.0f} s)")
        seconds["temperature"] = elapsed()

    write_mtp_checkpoint(base_dir, out_dir, {k: v.detach() for k, v in mtp.state_dict().items()})
    stored = MtpLayer(model_config)  # measured as written: the checkpoint stores the base dtype
    stored.load_state_dict(load_mtp_weights(out_dir))
    after = measure(stored.eval(), embed, lm_head, heldout, config.draft_steps)
    log(f"[train-draft] trained layer: accept length {after.mean_accept_length:.3f} with {config.draft_steps} draft "
        f"tokens over {after.rounds} verify rounds; draft prefix match per step {_fmt(after.per_step_match)}")
    after_tree = None
    if config.tree_topk > 1:
        after_tree = measure(stored.eval(), embed, lm_head, heldout, config.draft_steps, config.tree_topk)
        log(f"[train-draft] trained layer, tree drafts (topk {config.tree_topk}, {config.draft_steps} draft tokens): "
            f"accept length {after_tree.mean_accept_length:.3f} over {after_tree.rounds} verify rounds")
    seconds["total"] = elapsed()
    tenth = max(len(losses) // 10, 1)
    result = DraftTrainResult(
        out_dir=str(out_dir),
        corpus_sequences=len(corpus),
        corpus_tokens=sum(len(s.tokens) for s in corpus),
        train_steps=step,
        loss_first=sum(losses[:tenth]) / tenth,
        loss_last=sum(losses[-tenth:]) / tenth,
        best_step=fit.best_step,
        validation=fit.validation,
        before=asdict(before),
        start=asdict(start_acceptance) if start_acceptance is not None else None,
        after=asdict(after),
        after_tree=asdict(after_tree) if after_tree is not None else None,
        temperature=temperature,
        seconds={k: round(v, 1) for k, v in seconds.items()},
    )
    (out_dir / "draft-training.json").write_text(json.dumps({"config": asdict(config), "result": asdict(result)}, indent=2))
    return result


@torch.no_grad()
def fit_temperature(mtp: MtpLayer, embed, lm_head, sequences: list[Sequence], config) -> dict:
    """The draft temperature among config.tree_temperatures with the highest tree accept length on `sequences`
    (greedy continuations), per verified position (1 + the per-depth match rates: every position counts, where
    the decode walk would count about half of them). `mtp` is measured with its weights rounded to bfloat16, as
    the checkpoint stores them, and left unchanged; the logits are products in the training dtype. Ties go to the temperature
    nearest 1."""
    rounded = copy.deepcopy(mtp)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in mtp.state_dict().items()})
    rounded.eval()
    weight = rounded.final_layernorm.weight.detach().clone()
    head = lm_head.to(config.resolved_train_dtype())  # bf16 where native: 2.6x the rate of the float32 product
    scores, positions = {}, 0
    for t in config.tree_temperatures:
        rounded.final_layernorm.weight.copy_((weight / t).to(torch.bfloat16).float())
        a = measure(rounded, embed, head, sequences, config.draft_steps, config.tree_topk)
        scores[float(t)] = round(1 + sum(a.per_step_match), 5)
        positions = a.positions
    chosen = max(sorted(scores, key=lambda t: abs(math.log(t))), key=scores.get)
    return {"sequences": len(sequences), "positions": positions, "tree_accept": scores, "chosen": chosen}


def corpus_batch(batch_index: int, pool_size: int, config: DraftTrainConfig) -> tuple[list[int], float]:
    """Prompt indices and temperature of corpus batch `batch_index`: the pool in order, every other batch
    sampled; a batch that reaches past the pool's end wraps around and it and all later ones are sampled
    (a greedy repeat would be the same text), each with its own seed (the batch index)."""
    first = batch_index * config.corpus_batch_prompts
    indices = [j % pool_size for j in range(first, first + config.corpus_batch_prompts)]
    first_pass = first + config.corpus_batch_prompts <= pool_size
    return indices, config.sample_temperature if batch_index % 2 or not first_pass else 0.0


# A corpus batch's prefill is about a fifth of its time (128 prompts, 128 new tokens: 12 of 61 s, 2-core AVX2):
# with less of the phase left than this share of the previous batch, a new batch would make little text.
MIN_BATCH_SHARE = 0.3


def another_corpus_batch(left: float, last_batch: float) -> bool:
    """Whether to start a later corpus batch with `left` seconds of the corpus phase, the previous batch having
    taken `last_batch` seconds; otherwise the rest of the phase goes to training."""
    return left >= MIN_BATCH_SHARE * last_batch


def batch_order(lengths: list[int], batch: int, window_batches: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches of indices into `lengths`: shuffled, then each window of `window_batches` batches
    sorted by length and cut into batches, the batches shuffled again. Every index appears once."""
    order = rng.sample(range(len(lengths)), len(lengths))
    window = batch * window_batches
    batches = []
    for i in range(0, len(order), window):
        chunk = sorted(order[i:i + window], key=lambda j: lengths[j])
        batches += [chunk[j:j + batch] for j in range(0, len(chunk), batch)]
    rng.shuffle(batches)
    return batches


@torch.no_grad()
def linear_start(mtp: MtpLayer, embed: torch.Tensor, sequences: list[Sequence], ridge: float) -> None:
    """Make `mtp` the best linear draft step 1 over `sequences`, then let training grow the rest from it.

    With the attention and MLP branches zeroed (o_proj, down_proj: the residual stream is then input_proj's
    output), the layer computes final_layernorm(W u), u = [hidden_layernorm(h_t), token_layernorm(e_{t+1})].
    That equals h_{t+1} = w * z / rms(z) (w: the final norm's weight) when W u = c z for any c > 0, z = h_{t+1} /
    w. W is the ridge least-squares fit of z / rms(z) from u over every position: one 2H x 2H solve. (Refitting
    with each row's own scale, c = rms(W u) / rms(z), changed the held-out accept length by under 0.005.)
    The base's last layer, the default start, drafts nothing right (accept length 1.0); this start drafts from
    the first step, and the zeroed branches still get gradients (their inputs are not zero).
    """
    w = mtp.final_layernorm.weight.float()
    size = 2 * w.shape[0]
    gram = torch.zeros(size, size, dtype=torch.float64)
    cross = torch.zeros(size, w.shape[0], dtype=torch.float64)
    for s in sequences:
        n = len(s.tokens) - 1
        e = embed[s.tokens[1:]].masked_fill((torch.arange(n) == 0)[:, None], 0.0)
        u = torch.cat([mtp.hidden_layernorm(s.hidden[:n].float()), mtp.token_layernorm(e)], dim=-1)
        z = s.hidden[1:].float() / w
        z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True))
        gram += (u.T @ u).double()
        cross += (u.T @ z).double()
    gram += ridge * gram.diagonal().mean() * torch.eye(size, dtype=torch.float64)
    mtp.input_proj.weight.copy_(torch.linalg.solve(gram, cross).T.float())
    mtp.self_attn.o_proj.weight.zero_()
    mtp.mlp.down_proj.weight.zero_()


def loss_rows(batch: dict, prompt_len: int, share: float, gen: torch.Generator) -> torch.Tensor | None:
    """Sorted random start positions for unrolled_losses' rows: `share` of those from the first one with a
    label (the batch's shortest prompt) on; None when share is 1."""
    if share >= 1:
        return None
    n = batch["tokens"].shape[1] - 1
    first = min(max(prompt_len - 2, 0), n - 1)
    picked = torch.randperm(n - first, generator=gen)[:max(1, round((n - first) * share))]
    return picked.sort().values + first


@dataclass
class FitResult:
    steps: int
    losses: list[float]  # draft-1 hard cross-entropy per step
    best_step: int
    validation: list


def _evaluate(mtp, embed, head: OutputHead, sequences, config) -> list[float]:
    """Teacher-forced prefix match per draft step over `sequences`, weighted by labelled positions (float32)."""
    hits, counts = torch.zeros(config.draft_steps), torch.zeros(config.draft_steps)
    mtp.eval()
    with torch.no_grad():
        for i in range(0, len(sequences), config.batch_sequences):
            r = unrolled_losses(mtp, embed, head, collate(sequences[i:i + config.batch_sequences]),
                                config.draft_steps)
            c = torch.tensor(r.counts, dtype=torch.float32)
            hits += r.prefix_match * c
            counts += c
    mtp.train()
    return (hits / counts.clamp_min(1)).tolist()


def ema_update(decay: float):
    """AveragedModel's multi_avg_fn for an exponential moving average whose decay grows to `decay` as
    (1 + n) / (10 + n) after n updates: a short run keeps weights near its last ones rather than its first."""
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged) -> None:
        n = int(num_averaged)
        torch._foreach_lerp_(averaged, current, 1 - min(decay, (1 + n) / (10 + n)))
    return update


def fit_layer(mtp: MtpLayer, embed, lm_head, train: list[Sequence], validation: list[Sequence], vocab, config,
              deadline: float, rng: random.Random, log=print) -> FitResult:
    """Train `mtp` in place until time.monotonic() reaches `deadline` (or config.max_train_steps), evaluating
    on `validation` `config.validations` times and loading back the state with the best weighted chain match.
    At least one step runs."""
    # fused: one kernel for the whole step over the layer's 4.2M parameters (3.9 ms against 22 for the default
    # per-tensor loop at one thread; a one-step update at two threads 78 -> 72 ms, 2-core AVX2 EPYC)
    optimizer = torch.optim.AdamW(mtp.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=True)
    averaged = AveragedModel(mtp, multi_avg_fn=ema_update(config.ema_decay)) if config.ema_decay > 0 else None
    kept = averaged.module if averaged is not None else mtp  # the weights evaluated and returned
    head = OutputHead.of(lm_head, vocab)
    train_dtype = config.resolved_train_dtype()
    # autocast would otherwise cast the [V', H] head to bf16 again on every product
    train_head = OutputHead(head.weight.to(train_dtype), head.remap)
    weights = torch.tensor(config.step_weights)
    start = time.monotonic()
    total = max(deadline - start, 1e-9)
    batches: list[list[int]] = []
    lengths = [len(s.tokens) for s in train]
    targets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # top_targets per training sequence, on first use
    losses, history = [], []
    best = (-1.0, 0, None)
    next_eval = 1
    mtp.train()
    step = 0
    gen = torch.Generator().manual_seed(config.seed)

    def progress_now() -> float:  # of the time, or of max_train_steps, whichever comes first
        by_time = (time.monotonic() - start) / total
        by_steps = step / config.max_train_steps if config.max_train_steps is not None else 0.0
        return min(max(by_time, by_steps), 1.0)

    def evaluate():
        nonlocal best
        if not validation:
            return
        match = _evaluate(kept, embed, head, validation, config)
        history.append([step, round(time.monotonic() - start, 1), [round(m, 4) for m in match]])
        score = sum(match)  # expected accepted drafts per round, if positions were independent
        if score > best[0]:
            best = (score, step, {k: v.detach().clone() for k, v in kept.state_dict().items()})
        log(f"[train-draft] validation at step {step}: teacher-forced draft prefix match {_fmt(match)}")

    while time.monotonic() < deadline or step == 0:
        if config.max_train_steps is not None and step >= config.max_train_steps:
            break
        if not batches:
            batches = batch_order(lengths, config.batch_sequences, config.length_bucket_batches, rng)
        picked = batches.pop()
        for i in picked:
            if i not in targets:
                targets[i] = top_targets(train[i].hidden, train_head)
        batch = collate([train[i] for i in picked], [targets[i] for i in picked])
        rows = loss_rows(batch, min(train[i].prompt_len for i in picked), config.loss_rows, gen)
        progress = progress_now()
        lr = config.lr * min(1.0, (step + 1) / config.warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        chain = 1 if progress < config.single_step_share else config.draft_steps
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=train_dtype == torch.bfloat16):
            r = unrolled_losses(mtp, embed, train_head, batch, chain, metrics=False, rows=rows)
            loss = (weights[:chain] * (r.soft_ce + config.hidden_match_weight * r.hidden_err)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if averaged is not None:
            averaged.update_parameters(mtp)
        losses.append(r.hard_ce[0].item())
        step += 1
        if step % 10 == 0 or step == 1:
            recent = losses[-10:]
            log(f"[train-draft] step {step}: draft-1 loss {sum(recent) / len(recent):.3f}, per-step soft CE "
                f"{_fmt(r.soft_ce.tolist())}, hidden err {_fmt(r.hidden_err.tolist())}, lr {lr:.2e}, "
                f"{time.monotonic() - start:.0f} s")
        progress = progress_now()
        if progress >= next_eval / max(config.validations, 1):
            evaluate()
            next_eval = math.floor(progress * config.validations) + 1
    if not history or history[-1][0] != step:
        evaluate()
    if best[2] is not None:
        mtp.load_state_dict(best[2])
    elif averaged is not None:
        mtp.load_state_dict(averaged.module.state_dict())
    return FitResult(steps=step, losses=losses, best_step=best[1] if best[2] is not None else step,
                     validation=history)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


__all__ = ["DraftTrainConfig", "DraftTrainResult", "default_draft_dir", "train_draft"]
