"""train-draft on a tiny budget with the built-in model: the loss falls, the checkpoint is written and
measured, and a missing model is one clear error."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_llama import TINY_CONFIG, write_tiny_llama

from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights, load_mtp_weights
from tools.draft_training import train_draft as train_draft_module
from tools.draft_training.__main__ import main
from tools.draft_training.draft_acceptance import Acceptance, measure
from tools.draft_training.draft_corpus import (
    HELDOUT_TOPICS,
    MORE_TRAIN_TOPICS,
    TRAIN_TOPICS,
    Sequence,
    decode_batch,
    generate,
)
from tools.draft_training.mtp_layer import MtpLayer
from tools.draft_training.train_draft import (
    DraftTrainConfig,
    another_corpus_batch,
    batch_order,
    corpus_batch,
    fit_temperature,
    linear_start,
    load_base,
    loss_rows,
    train_draft,
)


def test_tiny_training_run_lowers_the_loss_and_writes_a_measured_checkpoint(model_dir, tmp_path):
    torch.set_num_threads(2)
    config = DraftTrainConfig(minutes=30, heldout_prompts=2, new_tokens=16,
                              corpus_batch_prompts=7, max_corpus_batches=1, max_train_steps=16, batch_sequences=4,
                              lr=1e-3, warmup_steps=2, validation_share=0.2, validations=4, single_step_share=0.5,
                              linear_start_ridge=0.0)  # from the last layer: a fitted start has little loss to lose
    lines = []
    result = train_draft(config, base_dir=model_dir, out_dir=tmp_path / "mtp", log=lines.append)
    assert result.corpus_sequences >= 4 and result.train_steps == 16
    assert len(result.validation) >= 4 and result.validation[-1][0] == 16
    assert result.best_step in [v[0] for v in result.validation]
    assert result.loss_last < 0.8 * result.loss_first, f"loss {result.loss_first:.3f} -> {result.loss_last:.3f}"
    assert any("step 10: draft-1 loss" in line for line in lines) and any("accept length" in line for line in lines)
    # the first half of the steps trains draft step 1 alone, the rest the unrolled chain of draft_steps
    soft_ce = {int(line.split("step ")[1].split(":")[0]): line.split("soft CE [")[1].split("]")[0].count(",") + 1
               for line in lines if "per-step soft CE" in line}
    assert soft_ce[1] == 1 and soft_ce[10] == config.draft_steps, soft_ce
    trained, initial = load_mtp_weights(tmp_path / "mtp"), fixed_seed_mtp_weights(model_dir, config.seed)
    assert set(trained) == set(initial)
    assert not torch.equal(trained["input_proj.weight"], initial["input_proj.weight"].to(torch.bfloat16).float())
    after = result.after
    assert after["rounds"] > 0 and 1.0 <= after["mean_accept_length"] <= 1 + config.draft_steps
    saved = json.loads((tmp_path / "mtp" / "draft-training.json").read_text())
    assert saved["result"]["after"] == after
    assert json.loads((tmp_path / "mtp" / "config.json").read_text())["architectures"] == ["MiMoForCausalLM"]
    assert result.start is None
    # one greedy sequence of the 7 (a quarter, rounded down) fitted the tree drafts' temperature, out of the corpus
    fit = saved["result"]["temperature"]
    assert fit["sequences"] == 1 and result.corpus_sequences <= 6
    assert [float(t) for t in fit["tree_accept"]] == list(config.tree_temperatures)
    assert fit["chosen"] in config.tree_temperatures and any("draft temperature" in line for line in lines)
    shutil.rmtree(tmp_path / "mtp")  # 270 MB; pytest keeps the last runs' tmp folders


def test_tiny_training_run_from_the_linear_start(model_dir, tmp_path):
    torch.set_num_threads(2)
    config = DraftTrainConfig(minutes=30, heldout_prompts=2, new_tokens=16, corpus_batch_prompts=6,
                              max_corpus_batches=1, max_train_steps=4, validations=1, vocab_limit=64)
    lines = []
    result = train_draft(config, base_dir=model_dir, out_dir=tmp_path / "mtp", log=lines.append)
    assert any("linear start: accept length" in line for line in lines)
    assert any("logits over the 64 most frequent token ids" in line for line in lines)
    assert result.start["rounds"] > 0 and 1.0 <= result.start["mean_accept_length"] <= 1 + config.draft_steps
    trained = load_mtp_weights(tmp_path / "mtp")
    # the start zeroes the branches' output projections; training moves them
    assert torch.count_nonzero(trained["self_attn.o_proj.weight"]) > 0
    assert torch.count_nonzero(trained["mlp.down_proj.weight"]) > 0
    shutil.rmtree(tmp_path / "mtp")


def test_generate_records_the_hidden_states_of_a_full_forward_pass(model_dir):
    torch.set_num_threads(2)
    model, tokenizer = load_base(Path(model_dir))
    prompt_ids = [tokenizer("The moon is")["input_ids"], tokenizer("Write a list of three colours:")["input_ids"]]
    assert len(prompt_ids[0]) != len(prompt_ids[1])  # left padding is exercised
    for temperature in (0.0, 0.8):
        sequences = generate(model, tokenizer, prompt_ids, 12, temperature, seed=1)
        for seq, p in zip(sequences, prompt_ids):
            assert seq is not None and seq.tokens[:len(p)].tolist() == p and len(seq.tokens) > len(p) + 4
            with torch.no_grad():
                full = model.model(input_ids=seq.tokens[None]).last_hidden_state[0]
            err = (seq.hidden - full).abs().max().item()
            assert err < 1e-3 * full.abs().max().item(), f"hidden state differs from a full pass by {err}"
            assert torch.equal(seq.greedy, model.lm_head(full).argmax(-1))
            if temperature == 0:
                assert torch.equal(seq.tokens[len(p):], seq.greedy[len(p) - 1:-1])


def test_decode_batch_continues_as_transformers_generate(model_dir):
    """The corpus decoder (packed prefill, preallocated cache, grouped attention) makes the tokens transformers'
    own greedy `generate` makes from a left-padded batch."""
    torch.set_num_threads(2)
    model, tokenizer = load_base(Path(model_dir))
    texts = ["The moon is", "Write a list of three colours:", "Once upon a time, in a small village by the sea,"]
    prompt_ids = [tokenizer(t)["input_ids"] for t in texts]
    new, _, _ = decode_batch(model, prompt_ids, 20)
    width = max(len(p) for p in prompt_ids)
    pad = tokenizer.eos_token_id
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=batch, attention_mask=(torch.arange(width) >= width - batch.ne(pad).sum(1,
                             keepdim=True)).long(), max_new_tokens=20, do_sample=False, pad_token_id=pad)
    assert torch.equal(new, out[:, width:])
    # past its deadline, decoding stops after the step in progress: one token, hidden states of the fed positions
    import time

    new, hidden, greedy = decode_batch(model, prompt_ids, 20, deadline=time.monotonic())
    assert new.shape == (3, 1) and hidden.shape[:2] == greedy.shape == (3, width)
    assert torch.equal(new, out[:, width:width + 1])


def test_decode_batch_refuses_projection_biases(model_dir):
    """q/k/v and gate/up run as one product each over concatenated weights and the MLP as SiLU: a bias or another
    activation would be dropped silently."""
    model, tokenizer = load_base(Path(model_dir))
    proj = model.model.layers[3].self_attn.k_proj
    proj.bias = torch.nn.Parameter(torch.zeros(proj.out_features))
    with pytest.raises(ValueError, match="biases"):
        decode_batch(model, [tokenizer("The moon is")["input_ids"]], 2)
    proj.bias = None
    model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="SiLU"):
        decode_batch(model, [tokenizer("The moon is")["input_ids"]], 2)


def test_finished_rows_leave_the_batch_unchanged(model_dir, monkeypatch):
    """Rows that made the end token leave the batch; the others decode on as before, and every row is the same
    up to its end token."""
    from tools.draft_training import draft_corpus

    torch.set_num_threads(2)
    model, tokenizer = load_base(Path(model_dir))
    texts = ["The moon is", "Write a list of three colours:", "Once upon a time, in a small village by the sea,",
             "def add(a, b):"]
    prompt_ids = [tokenizer(t)["input_ids"] for t in texts]
    steps = 16
    new0, hidden0, greedy0 = decode_batch(model, prompt_ids, steps)
    # an "end token" that row 0 makes early and no other row makes at all
    end = next(int(t) for t in new0[0, 1:] if not (new0[1:] == t).any())
    first = int((new0[0] == end).nonzero()[0])
    monkeypatch.setattr(draft_corpus, "COMPACT_EVERY", 2)
    new, hidden, greedy = decode_batch(model, prompt_ids, steps, eos_token_id=end)
    width = max(len(p) for p in prompt_ids)
    assert torch.equal(new[1:], new0[1:]) and torch.equal(new[0, :first + 1], new0[0, :first + 1])
    torch.testing.assert_close(hidden[1:], hidden0[1:], rtol=1e-4, atol=1e-4)
    assert torch.equal(greedy[1:], greedy0[1:])
    fed = width + first + 1  # row 0's fed positions: the prompt and its tokens up to the end token
    torch.testing.assert_close(hidden[0, :fed], hidden0[0, :fed], rtol=1e-4, atol=1e-4)
    assert torch.equal(greedy[0, :fed], greedy0[0, :fed])
    assert first + 3 < steps and not new[0, first + 3:].any()  # it left the batch: nothing written after


def test_missing_model_tells_to_prepare(tmp_path, capsys):
    assert main(["--base", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    assert "python -m sglang_ext.models prepare" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_training_topics_are_distinct_and_never_held_out():
    topics = TRAIN_TOPICS + MORE_TRAIN_TOPICS
    assert len(set(topics)) == len(topics) == 358
    assert not set(topics) & set(HELDOUT_TOPICS)
    # nor the same one in another spelling ("comet" / "comets", "violin" / "the violin")
    def stem(topic):
        return topic.lower().removeprefix("the ").removesuffix("s")
    assert not {stem(t) for t in topics} & {stem(h) for h in HELDOUT_TOPICS}


def test_weight_average_warms_up_then_decays_slowly():
    from torch.optim.swa_utils import AveragedModel

    from tools.draft_training.train_draft import ema_update

    layer = torch.nn.Linear(4, 4, bias=False)
    averaged = AveragedModel(layer, multi_avg_fn=ema_update(0.999))
    start = layer.weight.detach().clone()
    for _ in range(20):  # a short run: the average follows the weights
        with torch.no_grad():
            layer.weight.add_(1.0)
        averaged.update_parameters(layer)
    assert (averaged.module.weight - start).mean() > 0.6 * 20
    for _ in range(9000):  # (1 + n) / (10 + n) reaches 0.999: 10 updates move the average by about 1 %
        averaged.update_parameters(layer)
    before = averaged.module.weight.detach().clone()
    with torch.no_grad():
        layer.weight.add_(100.0)
    for _ in range(10):
        averaged.update_parameters(layer)
    torch.testing.assert_close(averaged.module.weight - before, torch.full((4, 4), 100 * (1 - 0.999 ** 10)))


def test_corpus_batches_walk_the_pool_then_wrap_around_sampled():
    config = DraftTrainConfig(corpus_batch_prompts=4)
    schedule = [corpus_batch(i, 10, config) for i in range(5)]
    assert [idx for idx, _ in schedule] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
    assert [t for _, t in schedule] == [0.0, config.sample_temperature] + [config.sample_temperature] * 3
    assert DraftTrainConfig(corpus_dtype="float32").resolved_corpus_dtype() == torch.float32
    assert DraftTrainConfig(corpus_dtype="auto").resolved_corpus_dtype() in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="corpus_dtype"):
        DraftTrainConfig(corpus_dtype="float16")
    with pytest.raises(ValueError, match="ema_decay"):
        DraftTrainConfig(ema_decay=1.0)
    # training runs from the corpus phase's end to final_seconds before the budget's end; none left is an error
    with pytest.raises(ValueError, match="no training time"):
        DraftTrainConfig(minutes=1, corpus_share=0.5, final_seconds=30)
    DraftTrainConfig(minutes=1, corpus_share=0.45, final_seconds=30)


def test_nucleus_gumbel_samples_top_p_at_the_temperature():
    from tools.draft_training.draft_corpus import NucleusGumbel

    scores = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, -3.0, -6.0, -9.0])
    rows = 40_000
    sampler = NucleusGumbel(0.8, torch.Generator().manual_seed(0), top_p=0.9)
    out = sampler(None, scores.expand(rows, -1).clone())
    assert torch.isfinite(out).sum(-1).eq(1).all()  # exactly one token left per row, for greedy to pick
    picks = out.argmax(-1)
    probs = (scores / 0.8).softmax(-1)
    keep = probs.cumsum(-1) - probs < 0.9  # top-p: the smallest prefix (scores are sorted) reaching 0.9
    expected = torch.where(keep, probs, 0) / probs[keep].sum()
    freq = torch.bincount(picks, minlength=len(scores)).float() / rows
    assert freq[~keep].sum() == 0
    assert (freq - expected).abs().max() < 4 * (expected * (1 - expected) / rows).sqrt().max()
    again = NucleusGumbel(0.8, torch.Generator().manual_seed(0), top_p=0.9)(None, scores.expand(rows, -1).clone())
    assert torch.equal(again.argmax(-1), picks)  # the seed decides


def test_loss_rows_draws_a_share_of_the_labelled_start_positions():
    batch = {"tokens": torch.zeros(4, 41, dtype=torch.long)}  # start positions 0..39
    gen = torch.Generator().manual_seed(0)
    assert loss_rows(batch, 12, 1.0, gen) is None
    draws = [loss_rows(batch, 12, 0.25, gen) for _ in range(50)]
    for rows in draws:  # the first start with a label is prompt_len - 2: its step-1 label is the prompt's last token
        assert len(rows) == 8 and rows.unique().numel() == 8 and torch.equal(rows, rows.sort().values)
        assert rows.min() >= 10 and rows.max() <= 39
    assert torch.cat(draws).unique().numel() == 30, "every labelled start position is drawn sometimes"
    assert loss_rows(batch, 200, 0.5, gen).tolist() == [39]  # a prompt longer than the batch: the last start


def test_batch_order_covers_every_sequence_once_with_less_padding():
    import random

    lengths = [random.Random(i).randint(20, 200) for i in range(203)]
    padded = lambda batches: sum(max(lengths[i] for i in b) * len(b) for b in batches)
    plain = batch_order(lengths, 4, 1, random.Random(0))
    sorted_ = batch_order(lengths, 4, 16, random.Random(0))
    for batches in (plain, sorted_):
        assert sorted(i for b in batches for i in b) == list(range(203))
        assert all(1 <= len(b) <= 4 for b in batches) and sum(len(b) < 4 for b in batches) <= 4
    assert padded(sorted_) < 0.9 * padded(plain), (padded(sorted_), padded(plain), sum(lengths))
    assert batch_order(lengths, 4, 16, random.Random(0)) == sorted_  # seeded


def test_linear_start_fits_the_normalised_target_from_the_layers_own_inputs(tmp_path):
    """Sequences made by a linear draft (h_{t+1} = final_layernorm(A u_t), branches zero): linear_start's weight
    is the least-squares fit of z / rms(z), z = h_{t+1} / w, from what input_proj sees in a forward pass
    (captured by a hook here, so the features are the layer's own: norms, the position-0 mask), and the fitted
    layer's outputs point where h_{t+1} does, which the starting layer's do not."""
    g = torch.Generator().manual_seed(0)
    hidden_size, vocab = TINY_CONFIG["hidden_size"], 40
    weights = fixed_seed_mtp_weights(write_tiny_llama(tmp_path / "base"), seed=3)
    weights["final_layernorm.weight"] = 0.2 + 2 * torch.rand(hidden_size, generator=g)  # uneven: h / w matters
    weights["hidden_layernorm.weight"] = 0.5 + torch.rand(hidden_size, generator=g)
    teacher = MtpLayer(TINY_CONFIG)
    teacher.load_state_dict(weights)
    with torch.no_grad():
        teacher.input_proj.weight.copy_(torch.randn(hidden_size, 2 * hidden_size, generator=g) * 0.3)
        teacher.self_attn.o_proj.weight.zero_()
        teacher.mlp.down_proj.weight.zero_()
    embed = torch.randn(vocab, hidden_size, generator=g)
    sequences = []
    with torch.no_grad():
        for _ in range(12):
            tokens = torch.randint(0, vocab, (24,), generator=g)
            h = [torch.randn(hidden_size, generator=g)]
            for t in range(len(tokens) - 1):  # the teacher's step at position t makes h_{t+1}
                out, _ = teacher(h[t][None, None], embed[tokens[t + 1]][None, None], torch.tensor([[t]]))
                h.append(out[0, 0])
            sequences.append(Sequence(tokens, torch.stack(h), tokens.clone(), prompt_len=1))

    student = MtpLayer(TINY_CONFIG)
    student.load_state_dict(weights)  # the last layer's branches, input_proj [I | I] / 2 + noise
    seen = []
    hook = student.input_proj.register_forward_hook(lambda module, args, out: seen.append(args[0][0]))

    def outputs():
        seen.clear()
        with torch.no_grad():
            return [student(s.hidden[None, :-1], embed[s.tokens[1:]][None], torch.arange(len(s.tokens) - 1)[None])[0][0]
                    for s in sequences]

    def alignment(outs):  # mean cosine of output and h_{t+1}
        return torch.cat([F.cosine_similarity(o, s.hidden[1:], dim=-1) for o, s in zip(outs, sequences)]).mean()

    before = alignment(outputs())
    features = torch.cat(seen).double()
    linear_start(student, embed, sequences, ridge=0.0)
    hook.remove()
    assert torch.count_nonzero(student.self_attn.o_proj.weight) == 0
    assert torch.count_nonzero(student.mlp.down_proj.weight) == 0
    z = torch.cat([s.hidden[1:] for s in sequences]) / weights["final_layernorm.weight"]
    z = (z / z.pow(2).mean(-1, keepdim=True).sqrt()).double()
    expected = torch.linalg.lstsq(features, z).solution.T.float()
    torch.testing.assert_close(student.input_proj.weight, expected, atol=1e-4, rtol=1e-4)
    after = alignment(outputs())
    assert after > 0.98 and before < 0.8, (before, after)


def test_a_corpus_batch_starts_only_with_time_for_more_than_its_prefill():
    assert another_corpus_batch(left=30.0, last_batch=60.0)
    assert not another_corpus_batch(left=10.0, last_batch=60.0)  # the prefill alone would take it


def _tiny_layer_and_text(tmp_path, count=6, length=20):
    g = torch.Generator().manual_seed(1)
    hidden_size, vocab = TINY_CONFIG["hidden_size"], 48
    mtp = MtpLayer(TINY_CONFIG)
    mtp.load_state_dict(fixed_seed_mtp_weights(write_tiny_llama(tmp_path / "base"), seed=3))
    embed, lm_head = torch.randn(vocab, hidden_size, generator=g), torch.randn(vocab, hidden_size, generator=g)
    sequences = []
    for _ in range(count):
        tokens = torch.randint(0, vocab, (length,), generator=g)
        sequences.append(Sequence(tokens, torch.randn(length, hidden_size, generator=g), tokens.roll(-1), 2))
    return mtp.eval(), embed, lm_head, sequences


def test_a_temperature_in_the_final_norm_scales_the_logits_and_keeps_chain_drafts(tmp_path):
    """What fit_temperature bakes into the checkpoint: final_layernorm.weight / T divides the draft logits by T
    and leaves greedy chain drafting as it was (the next step reads the output through an RMSNorm)."""
    mtp, embed, lm_head, sequences = _tiny_layer_and_text(tmp_path)
    hotter = MtpLayer(TINY_CONFIG)
    hotter.load_state_dict(mtp.state_dict())
    with torch.no_grad():
        hotter.final_layernorm.weight.div_(0.8)
    s = sequences[0]
    args = (s.hidden[None, :-1], embed[s.tokens[1:]][None], torch.arange(len(s.tokens) - 1)[None])
    with torch.no_grad():
        torch.testing.assert_close(hotter(*args)[0], mtp(*args)[0] / 0.8)
    chain, chain_hot = measure(mtp, embed, lm_head, sequences), measure(hotter.eval(), embed, lm_head, sequences)
    assert chain == chain_hot


def test_fit_temperature_keeps_the_best_tree_accept_and_leaves_the_layer(tmp_path, monkeypatch):
    mtp, embed, lm_head, sequences = _tiny_layer_and_text(tmp_path)
    before = {k: v.clone() for k, v in mtp.state_dict().items()}
    weight = mtp.final_layernorm.weight.detach().to(torch.bfloat16).float()
    matches = {0.8: [0.5, 0.3, 0.1], 0.9: [0.5, 0.3, 0.15], 1.0: [0.5, 0.3, 0.1], 1.25: [0.5, 0.3, 0.1]}
    measured = []

    def fake_measure(layer, embed_, head, seqs, steps, topk):  # the temperature read back from the layer's weight
        t = round((weight / layer.final_layernorm.weight).mean().item(), 2)
        measured.append((t, steps, topk, len(seqs), head.dtype))
        return Acceptance(mean_accept_length=0.0, rounds=1, per_step_match=matches[t], positions=11)

    monkeypatch.setattr(train_draft_module, "measure", fake_measure)
    config = DraftTrainConfig(tree_temperatures=(0.8, 0.9, 1.0), train_dtype="float32")
    fit = fit_temperature(mtp, embed, lm_head, sequences, config)
    assert fit == {"sequences": 6, "positions": 11, "tree_accept": {0.8: 1.9, 0.9: 1.95, 1.0: 1.9}, "chosen": 0.9}
    assert measured == [(t, 3, config.tree_topk, 6, torch.float32) for t in (0.8, 0.9, 1.0)]
    # a tie goes to the temperature nearest 1
    tie = fit_temperature(mtp, embed, lm_head, sequences, DraftTrainConfig(tree_temperatures=(0.8, 1.25, 1.0)))
    assert tie["chosen"] == 1.0
    assert all(torch.equal(v, before[k]) for k, v in mtp.state_dict().items())
    # and on real drafts (tree topk 4 over the tiny layer): every candidate measured, the layer untouched
    monkeypatch.undo()
    real = fit_temperature(mtp, embed, lm_head, sequences, config)
    assert set(real["tree_accept"]) == {0.8, 0.9, 1.0} and real["positions"] > 0
    assert all(torch.equal(v, before[k]) for k, v in mtp.state_dict().items())
