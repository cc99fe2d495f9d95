"""`python -m sglang_ext.pp plan` and reading weight bytes from safetensors headers."""

import json
import re
import struct
import subprocess
import sys

from pp_configs import CONFIGS, load_config

from sglang_ext.pp import PlanOptions, evaluate_default, load_shape, plan_partition
from sglang_ext.pp.cli import main


def test_plan_prints_factorizations_and_best_split(capsys):
    assert main(["plan", "--model-path", str(CONFIGS / "qwen3_32b.json"), "--gpus", "6", "--gpu-mem", "24"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+3\s+2\s+invalid: 64 attention heads not divisible by tp 3", out, re.M), out
    best = re.search(r"best: tp (\d) x pp (\d): .* --pp-layer-partition ([\d,]+)", out)
    assert best, out
    tp, pp, text = int(best.group(1)), int(best.group(2)), best.group(3)
    shape = load_shape(CONFIGS / "qwen3_32b.json")
    opts = PlanOptions(gpu_mem_gib=(24.0,) * 6)
    plan, default = plan_partition(shape, tp, pp, opts), evaluate_default(shape, tp, pp, opts)
    assert text == ",".join(map(str, plan.partition)), f"printed {text}, planner {plan.partition}"
    gain = f"{plan.capacity / default.capacity - 1:+.1%}"
    assert f"{plan.capacity:,} tokens; SGLang's default split" in out and gain in out, out
    assert len(re.findall(r"^\s+\d\s+\d+-\d+\s", out, re.M)) == pp, out  # one row per stage


def test_plan_accepts_a_model_folder_and_per_gpu_memory(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(load_config("qwen3_5_27b_like")))
    assert main(["plan", "--model-path", str(tmp_path), "--gpus", "4", "--gpu-mem", "24,24,16,16", "--tp", "1"]) == 0
    out = capsys.readouterr().out
    assert "24 + 24 + 16 + 16 GiB" in out and "default 0" in out and "best: tp 1 x pp 4" in out, out


def test_plan_rejects_wrong_number_of_memory_sizes(capsys):
    code = main(["plan", "--model-path", str(CONFIGS / "qwen3_32b.json"), "--gpus", "4", "--gpu-mem", "24,24"])
    assert code == 2 and "--gpu-mem has 2 values" in capsys.readouterr().err


def test_plan_with_paged_experts_counts_resident_experts(capsys):
    # Qwen3-30B-A3B whole does not leave KV room on 2 x 24 GiB; with 32 of 128 experts resident per MoE layer it does
    model = str(CONFIGS / "qwen3_30b_a3b.json")
    assert main(["plan", "--model-path", model, "--gpus", "2", "--gpu-mem", "24", "--tp", "1",
                 "--paged-experts-num-resident", "32"]) == 0
    out = capsys.readouterr().out
    plan = plan_partition(load_shape(model), 1, 2, PlanOptions(gpu_mem_gib=(24.0,) * 2, paged_experts_num_resident=32))
    assert plan.capacity > 0 and f"KV capacity (SGLang's min over ranks): {plan.capacity:,} tokens" in out, out


def test_module_entry_point_runs_without_importing_sglang():
    model = str(CONFIGS / "smollm2_135m.json")
    done = subprocess.run(
        [sys.executable, "-m", "sglang_ext.pp", "plan", "--model-path", model, "--gpus", "3", "--gpu-mem", "8"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "best: tp" in done.stdout, done.stdout
    probe = (
        "import sys; from sglang_ext.pp.cli import main; "
        f"main(['plan', '--model-path', {model!r}, '--gpus', '2', '--gpu-mem', '8']); "
        "print('SGLANG_IMPORTED' if any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules) else 'CLEAN')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("CLEAN"), done.stdout[-200:] + done.stderr[-500:]


def _write_safetensors(path, tensors: dict[str, int]):
    header, offset = {}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def test_weight_bytes_come_from_safetensors_headers(tmp_path):
    config = load_config("smollm2_135m")
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": 7000, "model.norm.weight": 3, "visual.blocks.0.attn.weight": 999}
    for layer in range(30):
        tensors[f"model.layers.{layer}.self_attn.qkv_proj.weight"] = 100 + layer
        tensors[f"model.layers.{layer}.mlp.experts.0.down_proj.weight"] = 50
        tensors[f"model.layers.{layer}.mlp.shared_expert.down_proj.weight"] = 5
    _write_safetensors(tmp_path / "model-00001-of-00001.safetensors", tensors)
    shape = load_shape(tmp_path)
    assert shape.layer_weight_bytes == tuple(155.0 + layer for layer in range(30)), shape.layer_weight_bytes
    assert shape.layer_routed_bytes == (50.0,) * 30
    assert shape.embed_bytes == 7000 and shape.lm_head_bytes == 7000, (shape.embed_bytes, shape.lm_head_bytes)
