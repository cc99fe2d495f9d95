"""Makes smollm2_qkv.safetensors: real Q/K/V of SmolLM2-135M-Instruct on real English text.

    python tests/kvformats/data/make_smollm2_fixture.py [--model DIR]

Model: the bf16 safetensors folder `python -m sglang_ext.models prepare` writes
(~/.cache/sglang-ext/models/SmolLM2-135M-Instruct; Llama, 30 layers, 9 Q heads, 3 KV heads, head_dim 64,
full RoPE). Text: TEXT below (the opening of the US Declaration of Independence, public domain), tokenized
with the model's tokenizer, first NUM_TOKENS tokens. The model runs in float32; hooks on q_proj / k_proj /
v_proj capture the projections of LAYERS, RoPE is applied to Q and K with the model's own rotary embedding
(so K is what a KV cache stores). Saved as float16: k, v [layers, T, 3, 64]; q [layers, NUM_QUERIES, 9, 64]
holding the queries of the last NUM_QUERIES positions (positions T - NUM_QUERIES .. T - 1).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

TEXT = (
    "When in the Course of human events, it becomes necessary for one people to dissolve the political bands "
    "which have connected them with another, and to assume among the powers of the earth, the separate and equal "
    "station to which the Laws of Nature and of Nature's God entitle them, a decent respect to the opinions of "
    "mankind requires that they should declare the causes which impel them to the separation. We hold these truths "
    "to be self-evident, that all men are created equal, that they are endowed by their Creator with certain "
    "unalienable Rights, that among these are Life, Liberty and the pursuit of Happiness. That to secure these "
    "rights, Governments are instituted among Men, deriving their just powers from the consent of the governed, "
    "That whenever any Form of Government becomes destructive of these ends, it is the Right of the People to alter "
    "or to abolish it, and to institute new Government, laying its foundation on such principles and organizing its "
    "powers in such form, as to them shall seem most likely to effect their Safety and Happiness. Prudence, indeed, "
    "will dictate that Governments long established should not be changed for light and transient causes; and "
    "accordingly all experience hath shewn, that mankind are more disposed to suffer, while evils are sufferable, "
    "than to right themselves by abolishing the forms to which they are accustomed. But when a long train of abuses "
    "and usurpations, pursuing invariably the same Object evinces a design to reduce them under absolute Despotism, "
    "it is their right, it is their duty, to throw off such Government, and to provide new Guards for their future "
    "security. Such has been the patient sufferance of these Colonies; and such is now the necessity which "
    "constrains them to alter their former Systems of Government. The history of the present King of Great Britain "
    "is a history of repeated injuries and usurpations, all having in direct object the establishment of an "
    "absolute Tyranny over these States. To prove this, let Facts be submitted to a candid world. He has refused "
    "his Assent to Laws, the most wholesome and necessary for the public good. He has forbidden his Governors to "
    "pass Laws of immediate and pressing importance, unless suspended in their operation till his Assent should be "
    "obtained; and when so suspended, he has utterly neglected to attend to them."
)
LAYERS = (0, 7, 14, 21, 29)
NUM_TOKENS = 448
NUM_QUERIES = 64
OUT = Path(__file__).with_name("smollm2_qkv.safetensors")


def main() -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/sglang-ext/models/SmolLM2-135M-Instruct"))
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    cfg = model.config
    ids = tok(TEXT, return_tensors="pt").input_ids[:, :NUM_TOKENS]
    assert ids.shape[1] == NUM_TOKENS, f"text gives only {ids.shape[1]} tokens"
    captured: dict[tuple[int, str], torch.Tensor] = {}

    def hook(layer: int, name: str):
        def fn(_mod, _inp, out):
            captured[(layer, name)] = out.detach()
        return fn

    for li in LAYERS:
        attn = model.model.layers[li].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(attn, name).register_forward_hook(hook(li, name))
    with torch.no_grad():
        model(ids)
        pos = torch.arange(NUM_TOKENS)[None]
        cos, sin = model.model.rotary_emb(captured[(LAYERS[0], "q_proj")], pos)
    d = cfg.head_dim
    qs, ks, vs = [], [], []
    for li in LAYERS:
        q = captured[(li, "q_proj")].view(1, NUM_TOKENS, cfg.num_attention_heads, d).transpose(1, 2)
        k = captured[(li, "k_proj")].view(1, NUM_TOKENS, cfg.num_key_value_heads, d).transpose(1, 2)
        v = captured[(li, "v_proj")].view(1, NUM_TOKENS, cfg.num_key_value_heads, d)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        qs.append(q[0].transpose(0, 1)[-NUM_QUERIES:])
        ks.append(k[0].transpose(0, 1))
        vs.append(v[0])
    tensors = {
        "q": torch.stack(qs).to(torch.float16).contiguous(),
        "k": torch.stack(ks).to(torch.float16).contiguous(),
        "v": torch.stack(vs).to(torch.float16).contiguous(),
    }
    for name, t in tensors.items():
        assert torch.isfinite(t).all(), name
    save_file(tensors, str(OUT), metadata={"layers": ",".join(map(str, LAYERS)), "model": "SmolLM2-135M-Instruct",
                                           "sm_scale": repr(d ** -0.5)})
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes):", {k: tuple(t.shape) for k, t in tensors.items()})


if __name__ == "__main__":
    main()
