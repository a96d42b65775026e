#!/usr/bin/env python3
"""Time to first token of a conversation's second turn through `runtime serve`, with the
prompt cache (the first turn ran on the same server) and without it (a fresh server), three
rounds; the second turn has ~1050 tokens, ~1035 of them the first turn's.

usage: prompt_cache_ttft.py RUNTIME_BINARY ARTIFACT_DIR
"""
import json
import sys
import time

from serve_client import post, start

binary, artifacts = sys.argv[1], sys.argv[2]
def server():
    return start(binary, artifacts)
def ask(base, messages, max_tokens=1):
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens}
    t = time.perf_counter()
    r = json.load(post(base, body))
    return time.perf_counter() - t, r
history = "The quick brown fox jumps over the lazy dog. " * 100
turn1 = [{"role": "system", "content": history}, {"role": "user", "content": "Summarize the text in five words."}]
for round in range(3):
    p, base = server()
    _, r1 = ask(base, turn1, 12)
    turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]}, {"role": "user", "content": "Now in three words."}]
    cached, r2 = ask(base, turn2)
    p.kill(); p.wait()
    p, base = server()
    fresh, r3 = ask(base, turn2)
    p.kill(); p.wait()
    print("prompt", r2["usage"]["prompt_tokens"], "cached tokens", r2["usage"]["prompt_tokens_details"]["cached_tokens"], "ttft cached %.3f s, fresh %.3f s, ratio %.2f" % (cached, fresh, cached / fresh))
