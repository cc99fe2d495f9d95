"""write_mtp_checkpoint: a MiMo folder whose names, shapes, zero biases and config SGLang's loaders accept."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from sglang_ext.models.mtp_checkpoint import (
    MTP_PREFIX,
    fixed_seed_mtp_weights,
    load_base_weights,
    load_mtp_weights,
    mtp_weight_shapes,
    write_mtp_checkpoint,
)
from tiny_llama import TINY_CONFIG, TOKENIZER_FILES, write_tiny_llama


@pytest.fixture
def tiny_base(tmp_path):
    return write_tiny_llama(tmp_path / "base")


def _read(folder):
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {n: f.get_tensor(n) for n in f.keys()}


def test_fixed_seed_weights_are_seeded_and_start_from_the_last_layer(tiny_base):
    a, b = fixed_seed_mtp_weights(tiny_base, 0), fixed_seed_mtp_weights(tiny_base, 0)
    c = fixed_seed_mtp_weights(tiny_base, 1)
    assert set(a) == set(mtp_weight_shapes(TINY_CONFIG))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["input_proj.weight"], c["input_proj.weight"])
    base = load_base_weights(tiny_base)
    last = f"model.layers.{TINY_CONFIG['num_hidden_layers'] - 1}."
    assert torch.equal(a["mlp.down_proj.weight"], base[last + "mlp.down_proj.weight"].float())
    assert torch.equal(a["final_layernorm.weight"], base["model.norm.weight"].float())
    assert not a["self_attn.k_proj.bias"].any()


def test_writer_copies_base_adds_zero_biases_and_the_mtp_layer(tiny_base, tmp_path):
    mtp = fixed_seed_mtp_weights(tiny_base, 3)
    out = write_mtp_checkpoint(tiny_base, tmp_path / "mimo", mtp)
    assert out == tmp_path / "mimo" and not (tmp_path / "mimo.partial").exists()
    base, written = load_base_weights(tiny_base), _read(out)
    for name, tensor in base.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
    for layer in range(TINY_CONFIG["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            bias = written[f"model.layers.{layer}.self_attn.{proj}.bias"]
            assert bias.shape == (base[f"model.layers.{layer}.self_attn.{proj}.weight"].shape[0],)
            assert bias.dtype == torch.bfloat16 and not bias.any()
    for name, shape in mtp_weight_shapes(TINY_CONFIG).items():
        stored = written[MTP_PREFIX + name]
        assert tuple(stored.shape) == shape and stored.dtype == torch.bfloat16
        assert torch.equal(stored, mtp[name].to(torch.bfloat16)), name
    extra = set(written) - set(base) - {MTP_PREFIX + n for n in mtp}
    assert all(n.endswith("_proj.bias") for n in extra) and len(extra) == 3 * TINY_CONFIG["num_hidden_layers"]
    loaded = load_mtp_weights(out)
    assert set(loaded) == set(mtp) and all(torch.equal(loaded[n], mtp[n].to(torch.bfloat16).float()) for n in mtp)

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MiMoForCausalLM"] and config["model_type"] == "qwen2"
    assert config["num_nextn_predict_layers"] == 1 and config["tie_word_embeddings"] is True
    assert config["layer_types"] == ["full_attention"] * TINY_CONFIG["num_hidden_layers"]
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim", "rope_parameters", "vocab_size"):
        assert config[key] == TINY_CONFIG[key]
    for name, text in TOKENIZER_FILES.items():
        assert (out / name).read_text() == text


def test_writer_rejects_incomplete_or_misshaped_layers(tiny_base, tmp_path):
    mtp = fixed_seed_mtp_weights(tiny_base)
    missing = {n: t for n, t in mtp.items() if n != "input_proj.weight"}
    with pytest.raises(ValueError, match="missing.*input_proj"):
        write_mtp_checkpoint(tiny_base, tmp_path / "a", missing)
    with pytest.raises(ValueError, match="shapes"):
        write_mtp_checkpoint(tiny_base, tmp_path / "b", {**mtp, "input_proj.weight": torch.zeros(3, 3)})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# Parameters of SGLang 0.5.23's MiMoForCausalLM (Qwen2Model with fused qkv/gate_up, lm_head tied) and MiMoMTP
# (models/mimo_mtp.py: embed, norms, input_proj, mtp_block = Qwen2DecoderLayer, lm_head shared at runtime).
def _block_params(prefix):
    return [prefix + n for n in ("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias", "self_attn.o_proj.weight",
                                 "mlp.gate_up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                                 "post_attention_layernorm.weight")]


def _shards(name):
    if "qkv_proj" in name:
        return {"q", "k", "v"}
    return {0, 1} if "gate_up_proj" in name else {None}


def _run_sglang_loader(load_weights, params, weights, **attrs):
    """Call SGLang's own load_weights on a stand-in module; returns {param: set of loaded shard ids}."""
    loaded = {n: set() for n in params}

    def recorder(name):
        return lambda param, tensor, shard=None: loaded[name].add(shard)

    stand_ins = {n: SimpleNamespace(weight_loader=recorder(n)) for n in params}
    module = SimpleNamespace(named_parameters=lambda: stand_ins.items(),
                             config=SimpleNamespace(tie_word_embeddings=True), **attrs)
    load_weights(module, weights.items())
    return loaded


def test_sglang_mimo_loaders_give_every_parameter_a_value(tiny_base, tmp_path):
    mimo_mtp = pytest.importorskip("sglang.srt.models.mimo_mtp")
    mimo = pytest.importorskip("sglang.srt.models.mimo")
    out = write_mtp_checkpoint(tiny_base, tmp_path / "mimo", fixed_seed_mtp_weights(tiny_base))
    weights = _read(out)

    target = ["model.embed_tokens.weight", "model.norm.weight"]
    for layer in range(TINY_CONFIG["num_hidden_layers"]):
        target += _block_params(f"model.layers.{layer}.")
    loaded = _run_sglang_loader(mimo.MiMoForCausalLM.load_weights, target, weights)
    assert {n: s for n, s in loaded.items() if s != _shards(n)} == {}

    draft = ["model.embed_tokens.weight", "model.token_layernorm.weight", "model.hidden_layernorm.weight",
             "model.input_proj.weight", "model.final_layernorm.weight", *_block_params("model.mtp_block.")]
    mapper = mimo_mtp.MiMoMTP.map_model_name_to_mtp_param_name
    loaded = _run_sglang_loader(mimo_mtp.MiMoMTP.load_weights, draft, weights,
                                map_model_name_to_mtp_param_name=lambda name: mapper(None, name))
    assert {n: s for n, s in loaded.items() if s != _shards(n)} == {}
