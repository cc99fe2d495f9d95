"""Where a 16-row forward (as a verify step computes it) and 16 one-row forwards (as decode steps) of the same
tokens first part, and what each KV format stores of the difference. transformers only, no SGLang.

    python benchmarks/batch_invariance_probe.py [--tokens 16]

SmolLM2 (the built-in model) in float32: the prompt is prefilled once; its greedy continuation of N tokens is
computed one token at a time with the KV cache, then again as one N-row forward over the same prefill cache.
Printed: per layer the K/V elements that differ and by how much, the int8 / octave bytes that differ when both are
quantized, the first layer with a difference, and whether layer 0's K projection input (RMSNorm of the embedding)
is equal while its output is not.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_ext.kvformats import get_format
from sglang_ext.models import prepare

PROMPT = "Once upon a time, in a small village by the sea,"


def layer_kv(cache, layer: int, start: int):
    """[tokens, heads, head_dim] K and V of one layer from position `start` on."""
    entry = cache.layers[layer]
    return entry.keys[0, :, start:].transpose(0, 1).contiguous(), entry.values[0, :, start:].transpose(0, 1).contiguous()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    n_new = ap.parse_args().tokens
    path = str(prepare())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    n = ids.shape[1]
    with torch.no_grad():
        prefill = model(ids, use_cache=True)
        one_row = copy.deepcopy(prefill.past_key_values)
        cur, new = prefill.logits[:, -1].argmax(-1, keepdim=True), []
        for _ in range(n_new):
            new.append(cur)
            out = model(cur, past_key_values=one_row, use_cache=True)
            cur = out.logits[:, -1].argmax(-1, keepdim=True)
        new = torch.cat(new, 1)
        together = copy.deepcopy(prefill.past_key_values)
        model(new, past_key_values=together, use_cache=True)
        layer0 = model.model.layers[0]
        emb = model.model.embed_tokens(new)[0]
        norm_rows = torch.cat([layer0.input_layernorm(emb[i:i + 1]) for i in range(n_new)])
        norm_all = layer0.input_layernorm(emb)
        w = layer0.self_attn.k_proj.weight
        k_all = F.linear(norm_all, w)
        k_rows = torch.cat([F.linear(norm_all[i:i + 1], w) for i in range(n_new)])
    fmts = {name: get_format(name, model.config.head_dim, model.config.head_dim)
            for name in ("int8", "octave_k3v4", "octave_k3v3")}
    first = None
    print(f"{n_new} tokens; per layer: K/V elements differing (max |diff|), format bytes differing (codes / scales)")
    for layer in range(model.config.num_hidden_layers):
        k1, v1 = layer_kv(together, layer, n)
        k2, v2 = layer_kv(one_row, layer, n)
        if first is None and not (torch.equal(k1, k2) and torch.equal(v1, v2)):
            first = layer
        stored = []
        for name, fmt in fmts.items():
            a, b = fmt.quantize(k1, v1), fmt.quantize(k2, v2)
            codes = sum(int((a[p] != b[p]).sum()) for p in ("k_codes", "v_codes"))
            scales = sum(int((a[p] != b[p]).sum()) for p in ("k_scales", "v_scales"))
            stored.append(f"{name} {codes}/{scales}")
        print(f"layer {layer:2d}: K {int((k1 != k2).sum())}/{k1.numel()} ({(k1 - k2).abs().max():.1e}), "
              f"V {int((v1 != v2).sum())}/{v1.numel()} ({(v1 - v2).abs().max():.1e}); " + ", ".join(stored))
    print(f"first layer whose K/V differ: {first}")
    print(f"layer 0 K projection input equal: {torch.equal(norm_all, norm_rows)}; output elements differing: "
          f"{int((k_all != k_rows).sum())}/{k_all.numel()} (max {(k_all - k_rows).abs().max():.1e})")


if __name__ == "__main__":
    main()
