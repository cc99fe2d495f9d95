"""Write a base Llama-shaped model plus one MTP layer as a MiMo checkpoint SGLang serves with NEXTN.

SGLang's `MiMoForCausalLM` is Qwen2 (Llama plus q/k/v biases) and its draft twin `MiMoMTP` reads the layer
stored under `model.mtp_layers.0.`:

    x = input_proj(cat(hidden_layernorm(h_t), token_layernorm(embed(token_{t+1}))))   # h_t: target hidden after
    y = final_layernorm(Qwen2DecoderLayer(x))                                          #      the final norm
    logits(token_{t+2}) = lm_head(y)                                                   # lm_head shared with target

The base weights are copied unchanged and the missing Qwen2 q/k/v biases are written as zeros, so the served
MiMo target computes exactly what the Llama base computes. Nothing here imports SGLang.
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

MTP_PREFIX = "model.mtp_layers.0."
MTP_ARCHITECTURE = "MiMoForCausalLM"
# SGLang has no config class of its own for MiMo; the real MiMo checkpoints declare a Qwen2 subclass through
# remote code. Plain "qwen2" gives SGLang and transformers the same Qwen2Config without remote code.
MTP_MODEL_TYPE = "qwen2"
_WEIGHT_FILES = "*.safetensors"
# Files of the base folder that are not copied: weights and config are rewritten, the marker belongs to `prepare`.
_NOT_COPIED = {"config.json", "model.safetensors.index.json", ".sglang-ext-prepared.json"}
_NORMS = ("token_layernorm", "hidden_layernorm", "final_layernorm")
_BLOCK_NORMS = ("input_layernorm", "post_attention_layernorm")


def load_config(base_dir) -> dict:
    path = Path(base_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: run `python -m sglang_ext.models prepare` to build the built-in model"
        )
    return json.loads(path.read_text())


def load_base_weights(base_dir) -> dict[str, torch.Tensor]:
    """Every tensor of the base folder's safetensors files, by name, in the stored dtype."""
    files = sorted(Path(base_dir).glob(_WEIGHT_FILES))
    if not files:
        raise FileNotFoundError(f"no {_WEIGHT_FILES} in {base_dir}: run `python -m sglang_ext.models prepare`")
    weights = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name)
    return weights


def mtp_weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Name (relative to MTP_PREFIX) -> shape of every tensor one MTP layer needs for this config."""
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    inter = config["intermediate_size"]
    shapes = {f"{n}.weight": (hidden,) for n in _NORMS + _BLOCK_NORMS}
    shapes["input_proj.weight"] = (hidden, 2 * hidden)
    for proj, size in (("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)):
        shapes[f"self_attn.{proj}.weight"] = (size, hidden)
        shapes[f"self_attn.{proj}.bias"] = (size,)
    shapes["self_attn.o_proj.weight"] = (hidden, q_size)
    shapes["mlp.gate_proj.weight"] = (inter, hidden)
    shapes["mlp.up_proj.weight"] = (inter, hidden)
    shapes["mlp.down_proj.weight"] = (hidden, inter)
    return shapes


def fixed_seed_mtp_weights(base_dir, seed: int = 0) -> dict[str, torch.Tensor]:
    """The untrained MTP layer for the model in `base_dir`, float32, keys relative to MTP_PREFIX.

    The decoder block is a copy of the base model's last layer (zero q/k/v biases), final_layernorm copies the
    base's final norm, the two input norms are ones, and input_proj is [I | I] / 2 plus N(0, 0.02) noise drawn
    from `seed`. Same seed, same tensors; it is also the starting point of `train-draft`.
    """
    config = load_config(base_dir)
    base = load_base_weights(base_dir)
    last = f"model.layers.{config['num_hidden_layers'] - 1}."
    shapes = mtp_weight_shapes(config)
    hidden = config["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    eye = torch.eye(hidden)
    weights = {}
    for name, shape in shapes.items():
        if name in ("token_layernorm.weight", "hidden_layernorm.weight"):
            weights[name] = torch.ones(shape)
        elif name == "final_layernorm.weight":
            weights[name] = base["model.norm.weight"].float().clone()
        elif name == "input_proj.weight":
            noise = torch.randn(shape, generator=generator) * 0.02
            weights[name] = torch.cat([eye, eye], dim=1) * 0.5 + noise
        elif name.endswith(".bias"):
            weights[name] = torch.zeros(shape)
        else:
            weights[name] = base[last + name].float().clone()
    return weights


def _check_mtp_weights(mtp_weights: dict[str, torch.Tensor], config: dict) -> None:
    expected = mtp_weight_shapes(config)
    missing = sorted(set(expected) - set(mtp_weights))
    unexpected = sorted(set(mtp_weights) - set(expected))
    if missing or unexpected:
        raise ValueError(f"MTP weights do not match the config: missing {missing}, unexpected {unexpected}")
    wrong = {n: (tuple(t.shape), expected[n]) for n, t in mtp_weights.items() if tuple(t.shape) != expected[n]}
    if wrong:
        raise ValueError(f"MTP weight shapes differ from the config (got, expected): {wrong}")


def mimo_config(base_config: dict) -> dict:
    """The base config re-declared as a Qwen2-layer MiMo model with one MTP layer."""
    config = {k: v for k, v in base_config.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp")}
    config["architectures"] = [MTP_ARCHITECTURE]
    config["model_type"] = MTP_MODEL_TYPE
    config["num_nextn_predict_layers"] = 1
    config["tie_word_embeddings"] = base_config.get("tie_word_embeddings", False)
    config["use_sliding_window"] = False
    config["sliding_window"] = None
    config["max_window_layers"] = base_config["num_hidden_layers"]
    config["layer_types"] = ["full_attention"] * base_config["num_hidden_layers"]
    return config


def load_mtp_weights(checkpoint_dir) -> dict[str, torch.Tensor]:
    """The MTP layer of a checkpoint written by write_mtp_checkpoint, float32, keys relative to MTP_PREFIX."""
    weights = {}
    for file in sorted(Path(checkpoint_dir).glob(_WEIGHT_FILES)):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.startswith(MTP_PREFIX):
                    weights[name[len(MTP_PREFIX):]] = f.get_tensor(name).float()
    if not weights:
        raise ValueError(f"no tensors under {MTP_PREFIX} in {checkpoint_dir}")
    return weights


def write_mtp_checkpoint(base_dir, out_dir, mtp_weights: dict[str, torch.Tensor]) -> Path:
    """Write base weights + zero q/k/v biases + `mtp_weights` (keys relative to MTP_PREFIX) to `out_dir`.

    The folder holds one model.safetensors (every tensor in the base weights' dtype), config.json for
    MiMoForCausalLM, and the base folder's tokenizer, chat-template and generation files. It is written to a
    sibling `<out_dir>.partial` and renamed, replacing an existing `out_dir`. Returns `out_dir`.
    Raises ValueError when `mtp_weights` lacks a tensor, has an extra one, or a shape differs from the config.
    """
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base_config = load_config(base_dir)
    _check_mtp_weights(mtp_weights, base_config)
    base = load_base_weights(base_dir)
    dtype = base["model.embed_tokens.weight"].dtype

    tensors = dict(base)
    if base_config.get("tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    for layer in range(base_config["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            prefix = f"model.layers.{layer}.self_attn.{proj}"
            if f"{prefix}.bias" not in tensors:
                tensors[f"{prefix}.bias"] = torch.zeros(tensors[f"{prefix}.weight"].shape[0], dtype=dtype)
    for name, tensor in mtp_weights.items():
        tensors[MTP_PREFIX + name] = tensor.detach().to(dtype).contiguous()

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(mimo_config(base_config), indent=2) + "\n")
    for file in base_dir.iterdir():
        if file.is_file() and file.name not in _NOT_COPIED and not file.match(_WEIGHT_FILES):
            shutil.copy2(file, tmp / file.name)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
