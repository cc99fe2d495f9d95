"""Multi-turn chat helpers for the agent-session tests (a module name no other test folder uses)."""

import re

import requests

LOG_LINE = re.compile(r"\[sglang-ext\] session retention: retained_tokens=(\d+) (.*)")


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ChatSession:
    """One agent conversation over /v1/chat/completions; every turn records the server's token ids.

    `reusable` is what turn k+1 can find cached: the previous prompt's ids plus the generated ids but the last
    (its KV is never computed), cut where the re-rendered prompt starts to differ from them.
    """

    def __init__(self, url: str, system_prompt: str, max_tokens: int = 12):
        self.url = url
        self.messages = [{"role": "system", "content": system_prompt}]
        self.max_tokens = max_tokens
        self.turns: list[dict] = []
        self._prev_ids: list[int] | None = None

    def turn(self, user_text: str) -> dict:
        self.messages.append({"role": "user", "content": user_text})
        body = {"model": "default", "messages": self.messages, "max_tokens": self.max_tokens, "temperature": 0,
                "return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
        r = requests.post(f"{self.url}/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        out = r.json()
        input_ids, output_ids = out["sglext"]["input_ids"], out["sglext"]["output_ids"][0]
        details = out["usage"].get("prompt_tokens_details") or {}
        record = {
            "prompt_tokens": out["usage"]["prompt_tokens"],
            "completion_tokens": out["usage"]["completion_tokens"],
            "cached_tokens": details.get("cached_tokens", 0),
            "prev_full": None if self._prev_ids is None else len(self._prev_ids) + 1,
            "reusable": 0 if self._prev_ids is None else common_prefix_len(self._prev_ids, input_ids),
            "input_ids": input_ids,
        }
        self._prev_ids = input_ids + output_ids[:-1]
        self.messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        self.turns.append(record)
        return record


def retention_counters(log_text: str) -> dict[str, int] | None:
    """The last counters line a retention server logged, as a dict (None if it logged none)."""
    last = None
    for m in LOG_LINE.finditer(log_text):
        last = m
    if last is None:
        return None
    counters = {"retained_tokens": int(last.group(1))}
    for item in last.group(2).split():
        key, _, value = item.partition("=")
        counters[key] = int(value)
    return counters
