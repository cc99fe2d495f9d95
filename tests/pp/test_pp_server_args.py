"""`--pp-layer-partition` through SGLang's own argument parser (no server is started)."""

import json

import pytest
from pp_configs import load_config

from sglang_ext.pp import PartitionError

ENV = "SGLANG_PP_LAYER_PARTITION"


@pytest.fixture(scope="module")
def prepare():
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import prepare_server_args

    from sglang_ext.pp import server_args

    server_args.register()
    server_args.register()  # idempotent: a second call must not add the flag twice
    HookRegistry.apply_hooks()
    return prepare_server_args


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("sglang_ext.pp.server_args.visible_gpu_memory_gib", lambda: None)  # no GPU here

    def write(name="smollm2_135m", **overrides):
        config = load_config(name)
        config.get("text_config", config).update(overrides)
        (tmp_path / "config.json").write_text(json.dumps(config))
        return str(tmp_path)

    return write


def _argv(path, *extra):
    return ["--model-path", path, "--pp-size", "3", *extra]


def test_explicit_list_is_exported_for_the_schedulers(prepare, config_dir):
    import os

    args = prepare(_argv(config_dir(), "--pp-layer-partition", "8,11,11"))
    assert args.pp_size == 3 and os.environ[ENV] == "8,11,11", os.environ.get(ENV)


def test_auto_plans_a_split(prepare, config_dir):
    import os

    prepare(_argv(config_dir(), "--pp-layer-partition", "auto"))
    assert os.environ[ENV] == "10,10,10", os.environ.get(ENV)


def test_auto_uses_device_memory_when_known(prepare, config_dir, monkeypatch):
    import os

    monkeypatch.setattr("sglang_ext.pp.server_args.visible_gpu_memory_gib", lambda: (24.0,) * 6)
    path = config_dir("qwen3_32b")
    prepare(["--model-path", path, "--pp-size", "3", "--tp-size", "2", "--pp-layer-partition", "auto"])
    from sglang_ext.pp import PlanOptions, load_shape, plan_partition

    expected = plan_partition(load_shape(path), 2, 3, PlanOptions(gpu_mem_gib=(24.0,) * 6))
    assert os.environ[ENV] == ",".join(map(str, expected.partition)) != "21,21,22", os.environ.get(ENV)


def test_auto_with_paged_experts_counts_resident_experts(prepare, config_dir, monkeypatch):
    import os

    monkeypatch.setattr("sglang_ext.pp.server_args.visible_gpu_memory_gib", lambda: (24.0, 16.0))
    path = config_dir("qwen3_30b_a3b")
    prepare(["--model-path", path, "--pp-size", "2", "--pp-layer-partition", "auto", "--enable-paged-experts",
             "--paged-experts-num-resident", "32"])
    from sglang_ext.pp import PlanOptions, load_shape, plan_partition

    shape = load_shape(path)
    expected = plan_partition(shape, 1, 2, PlanOptions(gpu_mem_gib=(24.0, 16.0), paged_experts_num_resident=32))
    unpaged = plan_partition(shape, 1, 2, PlanOptions(gpu_mem_gib=(24.0, 16.0)))
    assert expected.partition != unpaged.partition, "the test needs a split that paging changes"
    assert os.environ[ENV] == ",".join(map(str, expected.partition)), os.environ.get(ENV)


@pytest.mark.parametrize(
    "value, message",
    [
        ("8,11", "has 2 stages but --pp-size is 3"),
        ("8,11,12", "covers 31 layers but the model has 30"),
        ("0,15,15", "leaves stage 0 without layers"),
    ],
)
def test_bad_lists_raise_one_line_errors(prepare, config_dir, value, message):
    with pytest.raises(PartitionError, match=message):
        prepare(_argv(config_dir(), "--pp-layer-partition", value))


def test_raw_id_layer_off_stage_zero_is_named(prepare, config_dir):
    path = config_dir(engram_layer_ids=[11])
    with pytest.raises(PartitionError, match=r"layer 11 reads the raw input ids .* stage 1; stage 0 needs at least 12"):
        prepare(_argv(path, "--pp-layer-partition", "10,10,10"))
    import os

    prepare(_argv(path, "--pp-layer-partition", "auto"))
    assert int(os.environ[ENV].split(",")[0]) >= 12, os.environ[ENV]


def test_syntax_errors_are_argparse_errors(prepare, config_dir, capsys):
    with pytest.raises(SystemExit) as info:
        prepare(_argv(config_dir(), "--pp-layer-partition", "8;11;11"))
    assert info.value.code == 2
    assert "argument --pp-layer-partition: pp layer partition '8;11;11' is not 'auto'" in capsys.readouterr().err


def test_hand_set_env_keeps_working_and_is_checked(prepare, config_dir, monkeypatch):
    import os

    monkeypatch.setenv(ENV, "9,10,11")
    prepare(_argv(config_dir()))
    assert os.environ[ENV] == "9,10,11"
    monkeypatch.setenv(ENV, "9,10,12")
    with pytest.raises(PartitionError, match="covers 31 layers"):
        prepare(_argv(config_dir()))


def test_tied_lm_head_routing_on_the_last_rank():
    from types import SimpleNamespace

    from sglang_ext.pp import tied_lm_head

    def model(world_size, last, tied=True):
        pp = SimpleNamespace(world_size=world_size, is_last_rank=last)
        return SimpleNamespace(pp_group=pp, config=SimpleNamespace(tie_word_embeddings=tied))

    assert tied_lm_head.needs_own_lm_head(model(3, True))
    assert not tied_lm_head.needs_own_lm_head(model(3, False))
    assert not tied_lm_head.needs_own_lm_head(model(1, True))
    assert not tied_lm_head.needs_own_lm_head(model(3, True, tied=False))

    got = []
    weights = [("model.layers.29.mlp.down_proj.weight", 1), ("model.embed_tokens.weight", 2), ("model.norm.weight", 3)]
    rest = list(tied_lm_head.route_embedding_to_lm_head(weights, got.append))
    assert got == [2] and rest == [weights[0], weights[2]], (got, rest)

    class Head:
        def __init__(self):
            self.weight = SimpleNamespace(weight_loader=lambda param, tensor: loads.append(tensor))

    loads = []
    last = model(3, True)
    last.lm_head = Head()
    seen_by_original = tied_lm_head._around_load_weights(lambda m, w: {name for name, _ in w}, last, weights)
    expected = {"model.layers.29.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"}
    assert loads == [2] and seen_by_original == expected, (loads, seen_by_original)
    with pytest.raises(RuntimeError, match="no model.embed_tokens.weight reached"):
        fresh = model(3, True)
        fresh.lm_head = Head()
        tied_lm_head._around_load_weights(lambda m, w: set(dict(w)), fresh, weights[:1])


def test_tp_the_heads_cannot_split_is_one_line(prepare, config_dir, capsys):
    # SmolLM2: 9 attention heads, 3 KV heads. SGLang itself gets to weight loading and fails in a `narrow`.
    with pytest.raises(SystemExit) as info:
        prepare(["--model-path", config_dir(), "--tp-size", "2"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "sglang-ext: error: --tp-size 2 cannot shard this model (9 attention heads not divisible by tp 2; "
        "3 KV heads: tp 2 neither divides them nor is a multiple of them); tp sizes that can: 1, 3"
    ), err
    assert prepare(["--model-path", config_dir(), "--tp-size", "3"]).tp_size == 3
