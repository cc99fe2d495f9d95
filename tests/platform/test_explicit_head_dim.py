"""On the CPU platform a Qwen2-layer model keeps its config's head_dim (platform/explicit_head_dim.py).

SGLang's ModelRunner on device "cpu" records original_num_attention_heads on the config and SGLang's
Qwen2DecoderLayer then takes head_dim = hidden_size // that: for a MiMo-style model (hidden 256, 4 heads of 128)
the layer computed K/V of head_dim 64 into a pool of head_dim 128 and the first prefill failed on every attention
backend. Here SGLang's own adjust function and layer run in a fresh process with the plugin loaded from its entry
point, as in a server's scheduler.
"""

import json
import subprocess
import sys

import pytest

BUILD_LAYER = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt import runtime_context
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp
from sglang.srt.layers.layer_boundary import layer_stack
from sglang.srt.models.qwen2 import Qwen2DecoderLayer
from sglang.srt.server_args import ServerArgs

args = ServerArgs(model_path=sys.argv[1], device="cpu", skip_tokenizer_init=True)
with runtime_context.use_context(runtime_context.create_context(args, role="scheduler")):
    model_config = adjust_config_with_unaligned_cpu_tp(ModelConfig.from_server_args(args), LoadConfig(), 1)
    with layer_stack():
        layer = Qwen2DecoderLayer(config=model_config.hf_config, layer_id=0)
print(json.dumps({"pool_head_dim": model_config.head_dim, "layer_head_dim": layer.self_attn.head_dim,
                  "kv_size": layer.self_attn.kv_size,
                  "original_heads": getattr(model_config.hf_config, "original_num_attention_heads", None)}))
"""


@pytest.mark.parametrize("hidden, head_dim", [(256, 128), (512, 128)])
def test_qwen2_layer_keeps_the_config_head_dim_on_cpu(tmp_path, hidden, head_dim):
    config = {"architectures": ["MiMoForCausalLM"], "model_type": "qwen2", "hidden_size": hidden, "head_dim": head_dim,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 256,
              "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = subprocess.run([sys.executable, "-c", BUILD_LAYER, str(tmp_path)], check=False, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["original_heads"] == 4, f"SGLang no longer records the heads on device cpu: {got}"
    assert got["layer_head_dim"] == got["pool_head_dim"] == head_dim and got["kv_size"] == 2 * head_dim, (
        f"hidden {hidden}, head_dim {head_dim}: {got}")
