"""train-draft on a tiny budget with the built-in model: the loss falls, the checkpoint is written and
measured, and a missing model is one clear error."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from sglang_ext.models.__main__ import main
from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights, load_mtp_weights
from sglang_ext.models.draft_corpus import generate
from sglang_ext.models.train_draft import DraftTrainConfig, batch_order, corpus_batch, load_base, train_draft


def test_tiny_training_run_lowers_the_loss_and_writes_a_measured_checkpoint(model_dir, tmp_path):
    torch.set_num_threads(2)
    config = DraftTrainConfig(minutes=30, heldout_prompts=2, new_tokens=16,
                              corpus_batch_prompts=6, max_corpus_batches=1, max_train_steps=16, batch_sequences=4,
                              lr=1e-3, warmup_steps=2, validation_share=0.2, validations=4, single_step_share=0.5)
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
    shutil.rmtree(tmp_path / "mtp")  # 270 MB; pytest keeps the last runs' tmp folders


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


def test_missing_model_tells_to_prepare(tmp_path, capsys):
    assert main(["train-draft", "--base", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    assert "python -m sglang_ext.models prepare" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_corpus_batches_walk_the_pool_then_wrap_around_sampled():
    config = DraftTrainConfig(corpus_batch_prompts=4)
    schedule = [corpus_batch(i, 10, config) for i in range(5)]
    assert [idx for idx, _ in schedule] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
    assert [t for _, t in schedule] == [0.0, config.sample_temperature] + [config.sample_temperature] * 3
    assert DraftTrainConfig(corpus_dtype="float32").resolved_corpus_dtype() == torch.float32
    assert DraftTrainConfig(corpus_dtype="auto").resolved_corpus_dtype() in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="corpus_dtype"):
        DraftTrainConfig(corpus_dtype="float16")


def test_nucleus_gumbel_samples_top_p_at_the_temperature():
    from sglang_ext.models.draft_corpus import NucleusGumbel

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
