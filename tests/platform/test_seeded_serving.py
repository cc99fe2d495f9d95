"""End to end: per-request `sampling_seed` on the CPU platform.

SGLang 0.5.23 reads a request's seed only under `--enable-deterministic-inference` (without it the seed is
ignored); the seeded sampler then hashes (seed, position, token) with MurmurHash3, which on this platform is
ours (platform/seeded_sampling.py; SGLang's needs sgl_kernel's CPU build).
"""

PROMPT = "Write one sentence about the sea."


def test_same_seed_same_sample_and_seeds_differ(server_pool):
    server = server_pool.get("--dtype", "float32", "--max-total-tokens", "2000", "--mem-fraction-static", "0.95",
                             "--enable-deterministic-inference", name="seeded")

    def sample(seed):
        return tuple(server.generate(PROMPT, max_new_tokens=12, temperature=1.0, ignore_eos=True,
                                     sampling_seed=seed)["output_ids"])

    first = sample(7)
    assert len(first) == 12
    assert sample(7) == first, "the same seed sampled different tokens"
    assert sample(7) == first, "the same seed sampled different tokens on a third request (cache hit)"
    distinct = {first} | {sample(seed) for seed in (1, 2, 3, 4, 5)}
    assert len(distinct) >= 3, f"six seeds gave only {len(distinct)} distinct samples"
