"""Weight bytes per layer from a checkpoint's safetensors headers (no tensor data is read). Core.

A safetensors file starts with an 8-byte little-endian header length and a JSON header mapping tensor names to
{"dtype", "shape", "data_offsets"}; the byte size of a tensor is data_offsets[1] - data_offsets[0]. This gives
the real (quantized where the checkpoint is quantized) bytes, which replace `ModelShape`'s estimate.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path

from .model_shape import ModelShape

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_SKIP = ("visual.", "vision_tower", "vision_model", "audio_tower", "mtp.", "multi_modal_projector")


def read_tensor_bytes(folder: str | Path) -> dict[str, int]:
    """name -> stored bytes for every tensor of every *.safetensors file in `folder` (empty if none)."""
    sizes: dict[str, int] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                sizes[name] = end - begin
    return sizes


def shape_with_checkpoint_bytes(shape: ModelShape, tensor_bytes: dict[str, int]) -> ModelShape:
    """`shape` with layer / embedding / lm_head bytes summed from `tensor_bytes` (see read_tensor_bytes).

    Vision / audio towers and MTP heads are left out. Without an lm_head tensor (tied embeddings) the lm_head
    is priced like the embedding: under PP SGLang builds a separate lm_head on the last stage. Returns `shape`
    unchanged when no tensor names a decoder layer.
    """
    layers = [0.0] * shape.num_layers
    routed = [0.0] * shape.num_layers
    embed = lm_head = 0.0
    found = False
    for name, size in tensor_bytes.items():
        if any(part in name for part in _SKIP):
            continue
        match = _LAYER.search(name)
        if match:
            layer = int(match.group(1))
            if layer < shape.num_layers:
                found = True
                layers[layer] += size
                if ".experts." in name and "shared_expert" not in name:
                    routed[layer] += size
        elif "embed_tokens" in name or "per_layer" in name:
            embed += size
        elif "lm_head" in name:
            lm_head += size
    if not found:
        return shape
    return dataclasses.replace(
        shape,
        layer_weight_bytes=tuple(layers),
        layer_routed_bytes=tuple(routed),
        embed_bytes=embed or shape.embed_bytes,
        lm_head_bytes=lm_head or embed or shape.lm_head_bytes,
    )
