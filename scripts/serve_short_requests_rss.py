#!/usr/bin/env python3
"""RSS growth of `runtime serve --parallel 8` from eight 2-token requests at once, after one
request (docs/BENCHMARKS.md, session 11).

usage: serve_short_requests_rss.py RUNTIME_BINARY (from the repository root)
"""
import json, subprocess, sys, threading, time, urllib.request
binary = sys.argv[1]
p = subprocess.Popen([binary, "serve", "--port", "0", "--parallel", "8", "--artifacts", "artifacts/smollm2-135m-instruct"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
base = p.stdout.readline().strip().removeprefix("listening on ")
while True:
    try: urllib.request.urlopen(base + "/health"); break
    except Exception: time.sleep(0.05)
def rss():
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1]) // 1024
def ask(i):
    body = json.dumps({"messages": [{"role": "user", "content": f"Say the number {i}."}], "temperature": 0, "max_tokens": 2}).encode()
    urllib.request.urlopen(urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})).read()
ask(99); before = rss()
ts = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
after = rss()
print(json.dumps({"binary": binary, "rss_before_mb": before, "rss_after_mb": after, "growth_mb": after - before}))
p.kill(); p.wait()
