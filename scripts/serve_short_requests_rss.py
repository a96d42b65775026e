#!/usr/bin/env python3
"""RSS growth of `runtime serve --parallel 8` from eight 2-token requests at once, after one
request (docs/BENCHMARKS.md, session 11).

usage: serve_short_requests_rss.py RUNTIME_BINARY (from the repository root)
"""
import json
import sys
import threading

from serve_client import post, rss_mb, start

binary = sys.argv[1]
process, base = start(binary, "artifacts/smollm2-135m-instruct", "--parallel", "8")


def ask(i):
    post(base, {"messages": [{"role": "user", "content": f"Say the number {i}."}],
                "temperature": 0, "max_tokens": 2}).read()


ask(99)
before = rss_mb(process)
threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
after = rss_mb(process)
print(json.dumps({"binary": binary, "rss_before_mb": before, "rss_after_mb": after, "growth_mb": after - before}))
process.kill()
process.wait()
