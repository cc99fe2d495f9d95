"""The partition check and SGLang's default split (pure; no model config needed)."""

import pytest

from sglang_ext.pp import PartitionError, check_partition, default_partition, parse_partition


def test_default_split_matches_sglang_get_pp_indices(monkeypatch):
    from sglang.srt.distributed.utils import get_pp_indices

    monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION", raising=False)
    for layers in (7, 30, 48, 61, 64):
        for pp in range(1, 9):
            ours = default_partition(layers, pp)
            theirs = tuple(b - a for a, b in (get_pp_indices(layers, r, pp) for r in range(pp)))
            assert ours == theirs, f"{layers} layers, pp {pp}: ours {ours}, SGLang {theirs}"


def test_explicit_partition_feeds_sglang_unchanged(monkeypatch):
    from sglang.srt.distributed.utils import get_pp_indices

    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "8,11,11")
    check_partition((8, 11, 11), 3, 30)
    assert [get_pp_indices(30, r, 3) for r in range(3)] == [(0, 8), (8, 19), (19, 30)]


@pytest.mark.parametrize(
    "partition, pp, layers, raw, message",
    [
        ((8, 11), 3, 30, (), "has 2 stages but --pp-size is 3"),
        ((8, 11, 12), 3, 30, (), "covers 31 layers but the model has 30"),
        ((0, 15, 15), 3, 30, (), "leaves stage 0 without layers"),
        ((15, 0, 15), 3, 30, (), "leaves stage 1 without layers"),
        ((4, 13, 13), 3, 30, (6,), "layer 6 reads the raw input ids (PLE) and must be on stage 0"),
        ((4, 13, 13), 3, 30, (25,), "puts it on stage 2; stage 0 needs at least 26 layers"),
    ],
)
def test_bad_partitions_get_one_line_errors(partition, pp, layers, raw, message):
    with pytest.raises(PartitionError) as info:
        check_partition(partition, pp, layers, raw, "PLE")
    text = str(info.value)
    assert message in text, f"got: {text}"
    assert "\n" not in text, f"not one line: {text!r}"


def test_good_partitions_pass():
    check_partition((8, 11, 11), 3, 30)
    check_partition((7, 11, 12), 3, 30, raw_id_layers=(0, 6))
    check_partition((30,), 1, 30, raw_id_layers=(29,))


@pytest.mark.parametrize("text", ["", "8,,11", "8;11", "a,b", "-1,31", "8.5,21.5"])
def test_parse_rejects_non_lists(text):
    with pytest.raises(PartitionError, match="is not 'auto' or a comma-separated list"):
        parse_partition(text)


def test_parse_accepts_spaces():
    assert parse_partition(" 8, 11 ,11") == (8, 11, 11)
