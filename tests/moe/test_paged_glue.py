"""The paged-experts glue without a server: the lifted refusals (--tp-size, --pp-size; speculative decoding with
NEXTN, which SGLang runs as EAGLE) pass, the others are kept and name what
is supported, and the text the glue matches is still what SGLang 0.5.23 writes."""

import inspect
import types

import pytest

from sglang_ext import compat
from sglang_ext.moe import sglang_glue

SGLANG_REFUSALS = ["--tp-size must be 1 (single GPU only)", "--pp-size must be 1 (single GPU only)",
                   "--ep-size must be 1 (single GPU only)", "speculative decoding is not supported"]


@pytest.fixture(autouse=True)
def spec_algorithm(monkeypatch):
    """What SGLang's runtime context says of --speculative-algorithm (none unless a test sets it)."""
    spec = types.SimpleNamespace(speculative_algorithm=None)
    monkeypatch.setattr(compat, "get_spec", lambda: spec)
    return spec


def _raising(*problems):
    def original(layer, expert_format):
        if problems:
            raise RuntimeError(compat.PAGED_REFUSAL_PREFIX + "; ".join(problems))
    return original


@pytest.mark.parametrize("lifted", compat.PAGED_LIFTED_REFUSALS)
def test_lifted_refusal_passes(lifted):
    sglang_glue._check_compat(_raising(lifted), layer=None, expert_format=None)


def test_lifted_refusal_does_not_hide_others():
    with pytest.raises(RuntimeError) as info:
        sglang_glue._check_compat(_raising(*compat.PAGED_LIFTED_REFUSALS, "--ep-size must be 1 (single GPU only)"),
                                  layer=None, expert_format=None)
    assert str(info.value).startswith(compat.PAGED_REFUSAL_PREFIX + "--ep-size must be 1 (single GPU only) (")


def test_accepted_configuration_passes():
    sglang_glue._check_compat(_raising(), layer=None, expert_format=None)


@pytest.mark.parametrize("kept", [r for r in SGLANG_REFUSALS if r not in compat.PAGED_LIFTED_REFUSALS])
def test_refusals_stay_and_name_what_is_supported(kept):
    with pytest.raises(RuntimeError) as info:
        sglang_glue._check_compat(_raising(kept), layer=None, expert_format=None)
    text = str(info.value)
    assert text.startswith(compat.PAGED_REFUSAL_PREFIX + kept), text
    assert "supported: one GPU" in text, text


def test_speculative_refusal_lifted_for_nextn_only(spec_algorithm):
    spec_algorithm.speculative_algorithm = "EAGLE"  # SGLang's name for NEXTN
    sglang_glue._check_compat(_raising(compat.PAGED_SPEC_REFUSAL), layer=None, expert_format=None)
    for other in ("NGRAM", "STANDALONE", "EAGLE3"):
        spec_algorithm.speculative_algorithm = other
        with pytest.raises(RuntimeError) as info:
            sglang_glue._check_compat(_raising(compat.PAGED_SPEC_REFUSAL), layer=None, expert_format=None)
        assert str(info.value).startswith(compat.PAGED_REFUSAL_PREFIX + compat.PAGED_SPEC_REFUSAL + " ("), other
        assert "speculative decoding with NEXTN/MTP" in str(info.value)


def test_other_errors_pass_through():
    def original(layer, expert_format):
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="^something else$"):
        sglang_glue._check_compat(original, layer=None, expert_format=None)


def test_matched_text_is_sglangs():
    from sglang.srt.layers.moe.paged_experts import method

    source = inspect.getsource(method.check_paged_experts_compat)
    assert '"--{name.replace(\'_\', \'-\')} must be 1 (single GPU only)"' in source
    assert 'raise RuntimeError("Paged experts: " + "; ".join(problems))' in source
    assert '("tp_size", "ep_size", "pp_size", "dp_size")' in source
    assert '"speculative decoding is not supported"' in source
