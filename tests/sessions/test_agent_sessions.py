"""Agent sessions on a real server (CPU platform): turn k+1 prefills only what turn k did not leave cached,
and --session-retention-seconds keeps an idle session's prefix while one-off traffic overflows the device pool
and the HiCache host tier behind it; without the flag the same traffic pushes it out.

Retention tests run first: the last test uses the shared server, which later modules reuse."""

import pytest
from agent_chat import ChatSession, retention_counters
from server import SHARED_SERVER_ARGS
from text_fixtures import long_text

DEVICE_TOKENS = int(SHARED_SERVER_ARGS[SHARED_SERVER_ARGS.index("--max-total-tokens") + 1])
HOST_TOKENS = DEVICE_TOKENS * int(SHARED_SERVER_ARGS[SHARED_SERVER_ARGS.index("--hicache-ratio") + 1])
RETENTION_ARGS = (*SHARED_SERVER_ARGS, "--session-retention-seconds", "600")
# First words of the one-off prompts: distinct first tokens, so they share no prefix with each other.
FILLER_HEADS = ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliet",
                "Kilo", "Lima", "Mike", "November")


def _idle_session_then_flood(server) -> tuple[dict, dict, int]:
    """Session: two turns, then one-off prompts worth more than device + host, then its third turn.
    Returns (turn 2, turn 3, filler tokens)."""
    server.flush_cache()
    session = ChatSession(server.url, "You are the build agent of project Zephyr. Notes: " + long_text(220))
    session.turn("Which file should I read first?")
    second = session.turn("And after that one?")
    filler_tokens = 0
    for head in FILLER_HEADS:
        if filler_tokens > DEVICE_TOKENS + HOST_TOKENS:
            break
        out = server.generate(f"{head}. " + long_text(500)[::-1], max_new_tokens=1)
        filler_tokens += out["meta_info"]["prompt_tokens"]
    assert filler_tokens > DEVICE_TOKENS + HOST_TOKENS, filler_tokens
    third = session.turn("Good. Now run the tests.")
    return second, third, filler_tokens


def test_retention_keeps_idle_session_through_a_flood(server_pool):
    server = server_pool.get(*RETENTION_ARGS, name="retention")
    second, third, filler = _idle_session_then_flood(server)
    # Everything turn 2 left cached comes back (from device or host), though the flood was larger than both.
    assert third["cached_tokens"] >= third["reusable"] > second["prompt_tokens"], (third, filler)
    counters = retention_counters(server.log_text())
    assert counters is not None, "no retention counters in the server log"
    assert counters["retained_dropped_tokens"] == 0, counters
    assert counters["other_evicted_tokens"] >= filler - DEVICE_TOKENS, (counters, filler)
    assert counters["retained_tokens"] > 0, counters
    print(f"retention: turn 3 cached {third['cached_tokens']} of {third['prompt_tokens']}; {counters}")


def test_without_retention_the_flood_pushes_the_session_out(shared_server):
    second, third, filler = _idle_session_then_flood(shared_server)
    assert third["cached_tokens"] < second["prompt_tokens"] // 4, (third, filler)  # so the test above can fail
    print(f"no retention: turn 3 cached {third['cached_tokens']} of {third['prompt_tokens']}")


def test_four_sessions_five_turns_prefill_only_new_tokens(shared_server):
    shared_server.flush_cache()
    system = "You are a coding agent in a shared office. Tools: read_file, write_file, run_tests. " + long_text(60)
    tasks = ("fix the parser", "add a cache", "write the docs", "speed up the build")
    sessions = [ChatSession(shared_server.url, system) for _ in tasks]
    for turn in range(5):
        for task, session in zip(tasks, sessions):
            session.turn(f"Turn {turn + 1} of the task '{task}': what next?")
    system_tokens = min(len(s.turns[0]["input_ids"]) for s in sessions)
    for i, session in enumerate(sessions):
        first = session.turns[0]
        if i > 0:  # the shared system prompt is computed once
            assert first["cached_tokens"] >= system_tokens - 40, (i, first["cached_tokens"], system_tokens)
        for k, t in enumerate(session.turns[1:], start=2):
            # Exactly what the previous turn left cached and the re-rendered prompt still matches is reused.
            assert t["cached_tokens"] >= t["reusable"], (i, k, t["cached_tokens"], t["reusable"])
            assert t["reusable"] > t["prev_full"] - session.max_tokens - 1, (i, k, t["reusable"], t["prev_full"])
    lost = [t["prev_full"] - t["cached_tokens"] for s in sessions for t in s.turns[1:]]
    print(f"tokens of the previous turn not reused, per turn: {lost}")
