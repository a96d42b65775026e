#!/usr/bin/env python3
"""Time to first token of a short request (a 2-token answer) that arrives while a long prompt
is being prefilled alone by `runtime serve`, and the long prompt's own time, several rounds.

usage: ttft_during_prefill.py RUNTIME_BINARY ARTIFACT_DIR [LONG_WORDS] [ROUNDS]

LONG_WORDS (default 7000) words of text make a prompt of about 1.15 tokens a word for
SmolLM2; the short request is sent 2, 8 and 14 s after the long one (early, middle and late
in its prefill on 2 cores).
"""
import json
import sys
import threading
import time

from serve_client import post, start

binary, artifacts = sys.argv[1], sys.argv[2]
words = int(sys.argv[3]) if len(sys.argv) > 3 else 7000
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1


def first_token(base, started):
    """Seconds from `started` to the short request's first streamed content."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 2,
            "stream": True}
    with post(base, body, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: ") and b'"content"' in line:
                return time.perf_counter() - started
    return None


sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
for repeat in range(rounds):
    for delay in (2.0, 8.0, 14.0):
        p, base = start(binary, artifacts, "--parallel", "4")
        text = f"Round {repeat} {delay}. " + sentence * (words // 14)
        long_body = {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 1}
        result = {}

        def long_request():
            t = time.perf_counter()
            r = json.load(post(base, long_body, timeout=600))
            result["long_s"] = time.perf_counter() - t
            result["prompt_tokens"] = r["usage"]["prompt_tokens"]

        thread = threading.Thread(target=long_request)
        thread.start()
        time.sleep(delay)
        sent = time.perf_counter()
        ttft = first_token(base, sent)
        thread.join()
        p.kill()
        p.wait()
        print(json.dumps({"long_prompt_tokens": result["prompt_tokens"], "sent_after_s": delay,
                          "short_ttft_s": None if ttft is None else round(ttft, 3),
                          "long_total_s": round(result["long_s"], 2)}), flush=True)
