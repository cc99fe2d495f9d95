"""What the offline bundle carries (core: no SGLang import).

Measured from an import trace: SGLang's server entry point and the modules the portable GPU platform serves
(launch_server, HTTP server, tokenizer / detokenizer managers, scheduler, model runner, Triton attention, fused MoE,
hybrid linear attention, radix cache, HiCache, NEXTN / NGRAM workers, the Llama / Qwen3 / Qwen3.5 models) imported
in one process with torch's device queries faked, then sys.modules mapped to distributions. Distributions that are
imported there only because they happen to be installed (scipy, torchaudio, lxml, mistral-common, ...)
are left out; the bundle test imports the same modules in an interpreter that sees only the bundle, torch, Triton
and torchvision, so a distribution missing from these lists fails it.
"""

# What the target machine has: torch, Triton and torchvision (SGLang imports it at start-up; its compiled ops must
# match the machine's torch build, so it comes with torch, not with the bundle), and their requirements
# (pack.with_torch() walks them: numpy and pillow come with torchvision, so the bundle does not carry them).
WITH_TORCH = ("torch", "triton", "torchvision")

# Pure-Python distributions copied from this environment as installed (sources and dist-info).
PURE = (
    "transformers", "huggingface_hub",
    "accelerate", "aiohappyeyeballs", "aiosignal", "annotated-doc", "annotated-types", "anyio", "attrs", "certifi",
    "click", "compressed-tensors", "dill", "distro", "einops", "fastapi", "h11", "httpcore", "httpx", "idna",
    "jsonschema", "jsonschema-specifications", "loguru", "nvidia-ml-py", "openai", "opentelemetry-api", "packaging",
    "partial-json-parser", "pydantic", "pydantic-extra-types", "python-multipart", "referencing", "requests",
    "sniffio", "starlette", "tqdm", "typing-inspection", "urllib3", "uvicorn", "gguf",
    "ipython", "traitlets", "Pygments", "rich",  # sglang/utils.py imports IPython.display
    "pycparser",  # cffi's requirement
)

# Distributions with compiled extensions: the bundle carries their wheels for the target's Python (cp312).
BINARY = (
    "aiohttp", "charset-normalizer", "frozenlist", "msgspec", "multidict", "orjson", "propcache",
    "psutil", "pybase64", "pydantic_core", "PyYAML", "pyzmq", "regex", "rpds-py", "safetensors", "sentencepiece",
    "setproctitle", "tokenizers", "uvloop", "yarl",
    "apache-tvm-ffi", "xgrammar",  # SGLang's all-reduce module and function-call parsers import them
    "soundfile", "cffi",  # the HTTP server imports its audio-transcription route (soundfile carries libsndfile)
)

# SGLang's top-level parts the platform never imports (not in the trace): left out of the bundle. Compiled
# extensions of SGLang (its optional Rust server, gRPC and tree-cache modules) are built for this environment's
# Python and are left out too.
SGLANG_LEFT_OUT = ("sglang/multimodal_gen", "sglang/test", "sglang/benchmark", "sglang/cli")

# transformers' model folders that travel: those the trace imports (SGLang's configs and processors import many),
# plus the served families' configs. The others (about 27 MB of sources) stay out.
TRANSFORMERS_MODELS = (
    "aria", "auto", "beit", "bit", "blip", "bridgetower", "chameleon", "chinese_clip", "chmv2", "clip",
    "cohere2_vision", "cohere_compass", "conditional_detr", "convnext", "cosmos3_edge", "deepseek_ocr2",
    "deepseek_v3", "deepseek_vl", "deepseek_vl_hybrid", "deformable_detr", "deit", "depth_pro", "detr",
    "dinov3_vit", "donut", "dpt", "efficientloftr", "efficientnet", "emu3", "encoder_decoder", "eomt",
    "ernie4_5_vl_moe", "falcon_mamba", "flava", "fuyu", "gemma", "gemma3", "gemma4", "gemma4_unified", "glm46v",
    "glm4v", "glm5_next", "glm_image", "glm_ocr", "glmga", "glpn", "got_ocr2", "gpt2", "gpt_oss", "grounding_dino",
    "hunyuan_vl", "idefics", "idefics2", "idefics3", "imagegpt", "inkling", "janus", "kimi_k25", "kosmos2_5",
    "layoutlmv2", "layoutlmv3", "levit", "lfm2", "lfm2_moe", "lfm2_vl", "lightglue", "llama", "llama4", "llava",
    "llava_next", "llava_onevision", "mamba", "mamba2", "mask2former", "maskformer", "mellum", "mimo",
    "minicpmv4_6", "minimax_m3_vl", "mllama", "mobilenet_v1", "mobilenet_v2", "mobilevit", "muse_glimmer",
    "nemotron_h_omni", "neomme", "nougat", "oneformer", "ovis2", "owlv2", "owlvit", "paddleocr_vl", "perceiver",
    "perception_lm", "phi4_multimodal", "pi0", "pix2struct", "pixtral", "poolformer", "pp_chart2table",
    "pp_doclayout_v2", "pp_doclayout_v3", "pp_formulanet", "pp_lcnet", "pp_ocrv5_server_det", "pp_ocrv5_server_rec",
    "pp_ocrv6_small_rec", "prompt_depth_anything", "pvt", "qwen2", "qwen2_5_vl", "qwen2_moe", "qwen2_vl", "qwen3",
    "qwen3_5", "qwen3_5_moe", "qwen3_moe", "qwen3_next", "rf_detr", "rt_detr", "sam", "sam2", "sam3", "sapiens2",
    "segformer", "seggpt", "siglip", "siglip2", "slanext", "smolvlm", "step3p7", "superglue", "superpoint",
    "swin2sr", "t5", "textnet", "timm_wrapper", "tipsv2", "tipsv2_dpt", "tvp", "uvdoc", "video_llama_3",
    "video_llava", "videomae", "vilt", "vit", "vitmatte", "vitpose", "vivit", "whisper", "yolos", "zoedepth"
)
