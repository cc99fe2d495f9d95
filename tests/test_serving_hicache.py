"""HiCache host tier on the portable CPU platform: a prompt evicted from a small device pool to host RAM comes
back from host (cached_tokens_details.host > 0) with the same greedy output, for both host layouts."""

import pytest

from server import SHARED_SERVER_ARGS
from text_fixtures import long_text

PAGE_FIRST_ARGS = tuple(a if a != "layer_first" else "page_first" for a in SHARED_SERVER_ARGS)


DEVICE_POOL_TOKENS = int(SHARED_SERVER_ARGS[SHARED_SERVER_ARGS.index("--max-total-tokens") + 1])


def _evict_and_reload(server):
    a = long_text(700) + "\nQuestion: what is sold in the market? Answer:"
    b = "Story two. " + long_text(380)[::-1] + "\nSummary:"  # shares no prefix with a
    server.flush_cache()
    cold = server.generate(a, max_new_tokens=12)
    other = server.generate(b, max_new_tokens=4)
    a_tokens, b_tokens = cold["meta_info"]["prompt_tokens"], other["meta_info"]["prompt_tokens"]
    assert a_tokens + b_tokens > DEVICE_POOL_TOKENS, (a_tokens, b_tokens)  # b pushes a out of the device pool
    again = server.generate(a, max_new_tokens=12)
    details = again["meta_info"].get("cached_tokens_details") or {}
    assert details.get("host", 0) > 0, again["meta_info"]
    assert again["output_ids"] == cold["output_ids"], (again["text"], cold["text"])
    return details


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_evicted_prompt_comes_back_from_host(server_pool, layout):
    args = SHARED_SERVER_ARGS if layout == "layer_first" else PAGE_FIRST_ARGS
    server = server_pool.get(*args, name="shared" if layout == "layer_first" else "hicache-page-first")
    details = _evict_and_reload(server)
    print(f"{layout}: cached_tokens_details={details}")
