#!/usr/bin/env python3
"""Eight ~3800-token conversations at once through `runtime serve --parallel 8`, then each
one's next turn: prompt and cached tokens, times, RSS (docs/BENCHMARKS.md, session 11).

usage: serve_long_conversations.py RUNTIME_BINARY (from the repository root)
"""
import json
import sys
import threading
import time

from serve_client import post, rss_mb, start

process, base = start(sys.argv[1], "artifacts/smollm2-135m-instruct", "--parallel", "8")
sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
firsts = [{"messages": [{"role": "user", "content": f"Conversation {i}. " + sentence * 250}],
           "temperature": 0, "max_tokens": 4} for i in range(8)]


def all_at_once(bodies):
    """The answers to `bodies`, sent at once, and the seconds they took."""
    answers = [None] * len(bodies)

    def one(i):
        answers[i] = json.load(post(base, bodies[i]))

    started = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return answers, round(time.time() - started, 1)


first, first_s = all_at_once(firsts)
nexts = []
for body, answer in zip(firsts, first):
    body = json.loads(json.dumps(body))
    body["messages"] += [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And then?"}]
    nexts.append(body)
second, second_s = all_at_once(nexts)
print(json.dumps({"first_prompt_tokens": [a["usage"]["prompt_tokens"] for a in first], "first_turns_s": first_s,
                  "second_prompt_tokens": [a["usage"]["prompt_tokens"] for a in second],
                  "second_cached": [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in second],
                  "second_turns_s": second_s, "rss_mb": rss_mb(process)}))
process.kill()
process.wait()
