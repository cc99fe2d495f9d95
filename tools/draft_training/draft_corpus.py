"""Text the base model writes itself, with its hidden states: the training data of the MTP draft layer.

Prompts are built from topic x task templates (no data set is downloaded); training and held-out prompts use
disjoint topics (training prompts add more instruction shapes and code requests). Each sequence is generated
by the base model (greedy or sampled) in batches, recording the hidden states after the final norm as the
generation computes them, and the model's greedy next tokens.
"""

import itertools
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

TRAIN_TOPICS = (
    "the ocean", "volcanoes", "honey bees", "the Roman Empire", "black holes", "bread baking", "chess",
    "electric cars", "the human heart", "jazz music", "rainforests", "the moon landing", "photosynthesis",
    "machine learning", "coffee", "the printing press", "earthquakes", "penguins", "recycling", "solar panels",
    "the Great Wall of China", "vaccines", "friendship", "mountain climbing", "the internet", "dinosaurs",
    "time management", "gardening", "the water cycle", "ancient Egypt", "bicycles", "sleep", "libraries",
    "climate change", "robots", "the piano", "deserts", "the stock market", "rivers", "learning a language",
    "birds", "cooking pasta", "the French Revolution", "smartphones", "exercise", "the solar system",
    "volunteering", "trains", "cheese", "the immune system", "snow", "video games", "democracy", "whales",
)
# More topics, no training prompt task changed: a 20-minute corpus draws about 800 prompts, so each topic of
# the first 54 came back about 15 times; these spread the same number of prompts over 358 topics.
MORE_TRAIN_TOPICS = (
    "tornadoes", "hurricanes", "coral reefs", "butterflies", "ants", "spiders", "frogs", "sharks", "elephants",
    "wolves", "owls", "bats", "tigers", "kangaroos", "camels", "horses", "dolphins", "sea turtles", "crocodiles",
    "hummingbirds", "cats", "dogs", "rabbits", "squirrels", "bamboo", "cactus plants", "oak trees", "sunflowers",
    "roses", "the Amazon River", "the Sahara", "the Arctic", "Antarctica", "caves", "waterfalls", "islands",
    "lakes", "wetlands", "grasslands", "the Himalayas", "rainbows", "lightning", "clouds", "fog", "the seasons",
    "tides", "the atmosphere", "gravity", "magnets", "electricity", "sound waves", "light", "atoms", "DNA", "cells",
    "evolution", "genetics", "the brain", "the lungs", "bones", "muscles", "the skin", "digestion", "blood",
    "teeth", "the eyes", "hearing", "allergies", "the common cold", "nutrition", "vitamins", "drinking water",
    "meditation", "yoga", "running", "swimming", "stretching", "stress", "happiness", "habits", "motivation",
    "creativity", "curiosity", "patience", "honesty", "courage", "3D printing", "artificial intelligence",
    "cloud computing", "cybersecurity", "passwords", "email", "social media", "search engines", "programming",
    "databases", "blockchain", "virtual reality", "drones", "satellites", "GPS", "batteries", "nuclear power",
    "hydroelectric dams", "the light bulb", "the telephone", "radio", "television", "cameras", "photography",
    "film making", "podcasts", "computers", "keyboards", "microchips", "the steam engine", "airplanes", "rockets",
    "the space station", "Mars", "Jupiter", "the sun", "stars", "galaxies", "telescopes", "astronauts", "cars",
    "motorcycles", "ships", "roads", "skyscrapers", "castles", "pyramids", "cathedrals", "architecture", "cities",
    "villages", "farming", "tractors", "irrigation", "wheat", "rice", "potatoes", "apples", "bananas", "chocolate",
    "ice cream", "pizza", "soup", "spices", "vegetarian food", "breakfast", "baking cookies", "sushi", "barbecue",
    "fermentation", "salt", "sugar", "olive oil", "ancient Greece", "the Vikings", "the Maya", "the Aztecs",
    "the Industrial Revolution", "the Cold War", "World War I", "medieval knights", "samurai", "pirates",
    "the Wild West", "the Ottoman Empire", "the Mongol Empire", "ancient China", "the invention of writing",
    "the alphabet", "maps", "calendars", "clocks", "money", "banks", "taxes", "elections", "the United Nations",
    "human rights", "newspapers", "museums", "theater", "opera", "ballet", "painting", "sculpture", "poetry",
    "novels", "fairy tales", "mythology", "comic books", "board games", "football", "basketball", "tennis",
    "skiing", "surfing", "fishing", "camping", "hiking", "birdwatching", "knitting", "woodworking", "pottery",
    "drawing", "drums", "singing", "choirs", "hip hop", "classical music", "rock music", "folk dances", "festivals",
    "birthdays", "weddings", "holidays", "travel", "airports", "hotels", "packing a suitcase", "learning to drive",
    "job interviews", "saving money", "budgeting", "starting a business", "marketing", "teamwork", "leadership",
    "public speaking", "negotiation", "remote work", "homework", "exams", "universities", "online learning",
    "reading books", "writing essays", "mathematics", "fractions", "geometry", "statistics", "probability",
    "prime numbers", "the number zero", "chemistry", "physics", "biology", "geology", "weather forecasting",
    "pollution", "plastic waste", "composting", "renewable energy", "water conservation", "endangered species",
    "national parks", "zoos", "pets", "veterinarians", "doctors", "nurses", "hospitals", "firefighters", "teachers",
    "farmers", "chefs", "scientists", "engineers", "pilots", "journalists", "the postal service", "supermarkets",
    "fashion", "shoes", "colors", "soap", "furniture", "houses", "neighbors", "family dinners", "grandparents",
    "childhood", "memory", "dreams", "laughter", "languages", "sign language", "translation", "emojis",
    "handwriting", "puzzles", "riddles", "magic tricks", "circuses", "amusement parks", "fireworks", "candles",
    "kites", "umbrellas",
)
HELDOUT_TOPICS = (
    "lighthouses", "the Silk Road", "octopuses", "wind turbines", "origami", "glaciers", "the violin",
    "public transport", "mushrooms", "the Olympic Games", "tea ceremonies", "submarines", "kindness",
    "comets", "bridges", "the Renaissance",
)
CHAT_TASKS = (
    "Explain {} to a ten-year-old.", "Write a short story about {}.", "Give me three interesting facts about {}.",
    "What are the advantages and disadvantages of {}?", "Write a short poem about {}.",
    "Describe {} in one paragraph.", "Why is {} important?", "Write a blog post introduction about {}.",
)
RAW_TASKS = ("The history of {} began", "Here is a simple guide to {}:", "Most people do not know that {}")
# Only in training prompts (the held-out prompts stay those of CHAT_TASKS and RAW_TASKS): more instruction
# shapes, and code requests on subjects of their own.
MORE_CHAT_TASKS = (
    "Summarize what you know about {} in five bullet points.", "Write a dialogue between two friends about {}.",
    "Give step-by-step instructions related to {}.", "Compare {} with something similar and explain the "
    "differences.", "What are common misconceptions about {}?", "Write a short speech about {}.",
    "Answer as a teacher: how does {} work?", "Write a haiku and then explain it. The topic is {}.",
    "List five questions a student might ask about {}, with answers.", "Write an email to a friend about {}.",
    "Explain {} in simple words, then give an example.", "What would the world be like without {}?",
)
CODE_SUBJECTS = (
    "reverses a string", "checks whether a number is prime", "counts the words in a sentence",
    "computes the factorial of n", "finds the largest number in a list", "sorts a list of names",
    "converts Celsius to Fahrenheit", "removes duplicates from a list", "checks if a word is a palindrome",
    "sums the digits of a number", "returns the Fibonacci numbers below n", "merges two dictionaries",
    "reads a text file and counts its lines", "computes the average of a list", "finds the vowels in a string",
)
CODE_TASKS = ("Write a Python function that {}.", "Write a JavaScript function that {}, with comments.",
              "Explain how to write a program that {}.")


@dataclass
class Sequence:
    tokens: torch.Tensor  # [T] int64: prompt followed by the generated continuation
    hidden: torch.Tensor  # [T, H] float32: hidden state after the final norm at each position
    greedy: torch.Tensor  # [T] int64: the model's greedy next token after each position
    prompt_len: int


def prompts(topics, tokenizer, count: int, seed: int) -> list[list[int]]:
    """`count` prompt token lists: chat-template tasks and raw-text openings over `topics`, shuffled by `seed`."""
    texts = [("chat", t.format(topic)) for topic, t in itertools.product(topics, CHAT_TASKS)]
    texts += [("raw", t.format(topic)) for topic, t in itertools.product(topics, RAW_TASKS)]
    random.Random(seed).shuffle(texts)
    if count > len(texts):
        raise ValueError(f"only {len(texts)} distinct prompts for these topics, {count} asked")
    return _encode(texts[:count], tokenizer)


def train_prompts(tokenizer, seed: int) -> list[list[int]]:
    """Every training prompt (all training topics with all chat and raw tasks, plus the code requests), shuffled."""
    topics = TRAIN_TOPICS + MORE_TRAIN_TOPICS
    texts = [("chat", t.format(topic)) for topic, t in itertools.product(topics, CHAT_TASKS + MORE_CHAT_TASKS)]
    texts += [("raw", t.format(topic)) for topic, t in itertools.product(topics, RAW_TASKS)]
    texts += [("chat", t.format(subject)) for subject, t in itertools.product(CODE_SUBJECTS, CODE_TASKS)]
    random.Random(seed).shuffle(texts)
    return _encode(texts, tokenizer)


def _encode(texts: list[tuple[str, str]], tokenizer) -> list[list[int]]:
    ids = []
    for kind, text in texts:
        if kind == "chat":
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                     add_generation_prompt=True, tokenize=False)
            ids.append(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        else:
            ids.append(tokenizer(text)["input_ids"])
    return ids


NUCLEUS_TOP_P = 0.95
NUCLEUS_CANDIDATES = 64


class NucleusGumbel:
    """A sampler (`pick`: scores -> token ids; as a logits processor, `__call__` leaves only the picked token's
    score finite): among the
    NUCLEUS_CANDIDATES most likely tokens, the smallest set whose probability at `temperature` reaches top_p,
    one drawn by the Gumbel-max trick. Top-p sampling restricted to the
    candidates, without a softmax and a multinomial draw over the whole vocabulary: on the 2-core development
    machine a sampled batch of 128 prompts generated 205 tokens/s through transformers' sampling (top-p 0.95)
    against 491 greedy (bf16, 64 new tokens)."""

    def __init__(self, temperature: float, generator: torch.Generator, top_p: float = NUCLEUS_TOP_P,
                 candidates: int = NUCLEUS_CANDIDATES):
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature, self.generator, self.top_p, self.candidates = temperature, generator, top_p, candidates

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, self.pick(scores)[:, None], 0.0)

    def pick(self, scores: torch.Tensor) -> torch.Tensor:
        """[B, vocab] scores -> [B] sampled token ids."""
        top, ids = scores.float().topk(min(self.candidates, scores.shape[-1]), dim=-1)  # sorted, largest first
        logits = top / self.temperature
        probs = logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= self.top_p  # the most likely candidate always stays
        uniform = torch.rand(logits.shape, generator=self.generator).clamp_(1e-12, 1 - 1e-7)
        pick = (logits - (-uniform.log()).log()).masked_fill(outside, float("-inf")).argmax(-1, keepdim=True)
        return ids.gather(-1, pick)[:, 0]


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, temperature: float,
             seed: int, deadline: float | None = None) -> list[Sequence | None]:
    """Continue each prompt with the base model (temperature 0 = greedy; else NucleusGumbel's top-p sampling,
    reproducible from `seed`) and record hidden states.
    Returns one entry per prompt, None where fewer than 4 continuation tokens remain. With `deadline` (a
    time.monotonic() value), decoding stops at the first step that starts after it: shorter continuations.

    The hidden states are those the generation itself computes (decode_batch), so no second pass over the text
    is needed; the last generated token, never fed back, is dropped. `greedy` is the argmax of lm_head over
    them. A greedy sequence is cut where that argmax disagrees with the generated token (it should not: same
    numbers), so every continuation token of a greedy sequence is the model's own greedy choice: the acceptance
    simulation relies on it.
    """
    sampler = NucleusGumbel(temperature, torch.Generator().manual_seed(seed)) if temperature > 0 else None
    out, hidden, greedy = decode_batch(model, prompt_ids, max_new_tokens, sampler, tokenizer.eos_token_id,
                                       deadline)
    width = max(len(p) for p in prompt_ids)
    sequences = []
    for i, p in enumerate(prompt_ids):
        continuation = out[i].tolist()
        if tokenizer.eos_token_id in continuation:  # keep the end token: the draft should predict it too
            continuation = continuation[:continuation.index(tokenizer.eos_token_id) + 1]
        tokens = torch.tensor(p + continuation)
        offset = width - len(p)
        end = min(len(tokens), hidden.shape[1] - offset)
        row_hidden, row_greedy = hidden[i, offset:offset + end], greedy[i, offset:offset + end]
        if temperature == 0:
            mismatch = (row_greedy[len(p) - 1:end - 1] != tokens[len(p):end]).nonzero()
            if len(mismatch):
                end = len(p) + int(mismatch[0])
        keep = end - len(p) >= 4
        sequences.append(Sequence(tokens[:end], row_hidden[:end].clone(), row_greedy[:end].clone(), len(p))
                         if keep else None)
    return sequences


# Rows whose end token has been fed leave the batch (the others' KV cache copied into a smaller one) every
# COMPACT_EVERY steps once they are at least 1 / COMPACT_SHARE of it.
COMPACT_EVERY = 8
COMPACT_SHARE = 8


@torch.no_grad()
def decode_batch(model, prompt_ids: list[list[int]], steps: int, sampler=None, eos_token_id: int | None = None,
                 deadline: float | None = None):
    """Greedy (or `sampler`) decoding of a Llama-shaped transformers model over a preallocated KV cache.

    Returns (new_tokens [B, n], hidden [B, width + n - 1, H], greedy [B, width + n - 1]), n <= steps: row i's
    prompt sits right-aligned in the first width = max prompt length positions (the padding before it is
    never computed and never attended to), hidden holds the final norm's output at every fed position and
    greedy its lm_head argmax. Rows whose `eos_token_id` has been fed leave the batch (COMPACT_EVERY): what a
    row holds after its end token's position is unspecified. Decoding stops early once every row has made it, or at the first
    step after `deadline` (time.monotonic()); the tensors then end at the last step made.

    Why not transformers' `generate`: its dynamic cache concatenates every layer's K/V at every step and eager
    attention copies them again three times over for the GQA groups, and a left-padded batch prefills its
    padding. Here the prompts are prefilled as one packed row, K/V are written once into their slots and the q
    heads of a group attend to them through a broadcast product: on a 2-core AMD EPYC with AVX2 only (float32,
    128 prompts, 128 new tokens) a batch took 116-120 s against 205-234 s with `generate`.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    inner, cfg = model.model, model.config
    batch, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    layers = inner.layers
    kv_heads = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // kv_heads
    dtype = inner.embed_tokens.weight.dtype
    capacity = width + steps
    keys = torch.zeros(len(layers), batch, kv_heads, capacity, head_dim, dtype=dtype)
    values = torch.zeros_like(keys)
    hidden = torch.zeros(batch, capacity - 1, cfg.hidden_size, dtype=torch.float32)
    greedy = torch.zeros(batch, capacity - 1, dtype=torch.long)
    new_tokens = torch.zeros(batch, steps, dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompt_ids])

    head = model.lm_head.weight

    def logits_of(h):
        """[n, H] -> [n, vocab] as head @ h^T in blocks of 1,024 vocabulary rows, each block's [1024, n] written
        transposed into the output: at n = 128 about 80 ms against 160 for F.linear, whose h @ head^T MKL runs
        at half the rate (2-core AMD EPYC, AVX2, float32); one product of the whole head is as fast but leaves
        [vocab, n], whose transposition or row-wise argmax costs 30-75 ms more. In bf16 F.linear is the faster
        (24 against 33 ms at n = 128, argmax included; 2-core AVX512-BF16 EPYC)."""
        if h.dtype == torch.bfloat16:
            return F.linear(h, head)
        out = h.new_empty(h.shape[0], head.shape[0])
        for i in range(0, head.shape[0], 1024):
            out[:, i:i + 1024] = (head[i:i + 1024] @ h.T).T
        return out

    def top_of(logits):
        """Row-wise argmax, once per step (the token and the greedy record), in float32: bf16's argmax ran at a
        third of the rate (12 against 4 ms at [128, 49152], conversion included)."""
        return logits.float().argmax(-1)

    # q/k/v and gate/up as one product each, the MLP's activation SiLU
    if any(proj.bias is not None for l in layers for proj in (l.self_attn.q_proj, l.self_attn.k_proj,
                                                             l.self_attn.v_proj, l.mlp.gate_proj, l.mlp.up_proj)):
        raise ValueError("decode_batch takes Llama layers without q/k/v or gate/up biases")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"decode_batch takes Llama layers with a SiLU MLP, not {cfg.hidden_act!r}")
    qkv_weights = [torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight])
                   for l in layers]
    qkv_split = (cfg.num_attention_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    gate_up_weights = [torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight]) for l in layers]

    def attention_block(li, x, rotary, write, attend):
        """Decoder layer li over x [b, t, H]: K/V stored by write(k, v), attention by attend(q); rotary: the
        (cos, sin) of x's positions, computed once for all layers."""
        layer = layers[li]
        h = layer.input_layernorm(x)
        b, t = x.shape[:2]
        q, k, v = (part.view(b, t, -1, head_dim).transpose(1, 2)
                   for part in F.linear(h, qkv_weights[li]).split(qkv_split, dim=-1))
        q, k = apply_rotary_pos_emb(q, k, *rotary)
        write(k, v)
        x = x + layer.self_attn.o_proj(attend(q).transpose(1, 2).reshape(b, t, -1))
        gate, up = F.linear(layer.post_attention_layernorm(x), gate_up_weights[li]).chunk(2, dim=-1)
        return x + layer.mlp.down_proj(F.silu(gate) * up)

    # Prefill, packed: the prompts' tokens are one [1, N] row for every position-wise product (no padding
    # computed); attention runs on the padded [B, width] layout the cache already has.
    owner = torch.cat([torch.full((len(p),), i) for i, p in enumerate(prompt_ids)])
    row = torch.cat([torch.arange(width - len(p), width) for p in prompt_ids])
    positions = torch.cat([torch.arange(len(p)) for p in prompt_ids])[None]
    first = width - lengths
    r = torch.arange(width)
    allowed = (r[None, None, :] <= r[None, :, None]) & (r[None, None, :] >= first[:, None, None])
    allowed |= (r[None, :, None] < first[:, None, None])  # padding rows: anything (their output is dropped)
    prefill_mask = torch.zeros(batch, 1, width, width, dtype=dtype).masked_fill_(~allowed[:, None], float("-inf"))
    x = inner.embed_tokens(torch.tensor([t for p in prompt_ids for t in p]))[None]
    rotary = inner.rotary_emb(x, positions)
    for li in range(len(layers)):
        def write(k, v, li=li):
            keys[li, owner, :, row] = k[0].transpose(0, 1)
            values[li, owner, :, row] = v[0].transpose(0, 1)

        def attend(q, li=li):  # q [1, heads, N, d] -> [1, heads, N, d]
            padded = q.new_zeros(batch, width, q.shape[1], head_dim)
            padded[owner, row] = q[0].transpose(0, 1)
            o = F.scaled_dot_product_attention(padded.transpose(1, 2), keys[li, :, :, :width],
                                               values[li, :, :, :width], attn_mask=prefill_mask, enable_gqa=True)
            return o.transpose(1, 2)[owner, row].transpose(0, 1)[None]
        x = attention_block(li, x, rotary, write, attend)
    h = inner.norm(x)[0]
    hidden[owner, row] = h.float()
    # greedy tokens of every prompt position, 1,024 positions at a time (all at once: about 1 GB of logits)
    greedy[owner, row] = torch.cat([top_of(logits_of(part)) for part in h.split(1024)])
    logits = logits_of(h[torch.cumsum(lengths, 0) - 1])  # each prompt's last position
    top = top_of(logits)

    finished = torch.zeros(batch, dtype=torch.bool)
    slot = torch.arange(capacity)
    pad_mask = torch.where(slot[None, :] < (width - lengths)[:, None], float("-inf"), 0.0)  # [B, capacity]
    scale = head_dim ** -0.5
    alive = torch.arange(batch)  # the rows still decoded (the others have made eos_token_id)
    for step in range(steps):
        token = top if sampler is None else sampler.pick(logits)
        new_tokens[alive, step] = token
        fed_end = finished.clone()  # rows whose end token has been fed: its hidden state is recorded
        if eos_token_id is not None:
            finished |= token == eos_token_id
        if step == steps - 1 or finished.all() or (deadline is not None and time.monotonic() > deadline):
            break
        if step % COMPACT_EVERY == COMPACT_EVERY - 1 and fed_end.sum() * COMPACT_SHARE >= len(alive):
            keep = ~fed_end
            alive, token, lengths, pad_mask, logits, finished = (
                t[keep] for t in (alive, token, lengths, pad_mask, logits, finished))
            top = top[keep]
            keys, values = keys[:, keep], values[:, keep]
        rows = len(alive)
        pos = width + step  # the cache slot of the token fed now
        x = inner.embed_tokens(token)[:, None]
        rotary = inner.rotary_emb(x, (lengths + step)[:, None])
        # attention runs over the whole cache, the slots after pos masked: a slice [:pos + 1] of it is not
        # contiguous, and the bf16 matmul copied it (K and V of every layer at every step, about half of a step
        # at 200 slots, 2-core AVX512-BF16 EPYC)
        mask = pad_mask.masked_fill(slot > pos, float("-inf"))[:, None, None].to(dtype)  # [rows, 1, 1, capacity]
        for li in range(len(layers)):
            def write(k, v, li=li, pos=pos):
                keys[li, :, :, pos] = k[:, :, 0]
                values[li, :, :, pos] = v[:, :, 0]

            def attend(q, li=li, mask=mask, rows=rows):  # q [rows, kv_heads x group, 1, d] -> the same
                qg = q.view(rows, kv_heads, group, head_dim)
                scores = torch.matmul(qg, keys[li].transpose(-1, -2)) * scale + mask
                probs = scores.float().softmax(-1).to(dtype)
                return torch.matmul(probs, values[li]).view(rows, -1, 1, head_dim)
            x = attention_block(li, x, rotary, write, attend)
        h = inner.norm(x)[:, 0]
        hidden[alive, pos] = h.float()
        logits = logits_of(h)
        top = top_of(logits)
        greedy[alive, pos] = top
    made = step + 1
    return new_tokens[:, :made], hidden[:, :width + made - 1], greedy[:, :width + made - 1]
