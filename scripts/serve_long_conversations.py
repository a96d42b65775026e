#!/usr/bin/env python3
"""Eight ~3800-token conversations at once through `runtime serve --parallel 8`, then each
one's next turn: prompt and cached tokens, times, RSS (docs/BENCHMARKS.md, session 11).

usage: serve_long_conversations.py RUNTIME_BINARY (from the repository root)
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
def post(body):
    return json.load(urllib.request.urlopen(urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=900))
sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
firsts = [{"messages": [{"role": "user", "content": f"Conversation {i}. " + sentence * 250}], "temperature": 0, "max_tokens": 4} for i in range(8)]
def run_all(bodies):
    out = [None] * len(bodies)
    def one(i): out[i] = post(bodies[i])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    [t.start() for t in ts]; [t.join() for t in ts]
    return out
t = time.time(); a = run_all(firsts); t1 = time.time() - t
nexts = []
for body, ans in zip(firsts, a):
    b = json.loads(json.dumps(body))
    b["messages"] += [{"role": "assistant", "content": ans["choices"][0]["message"]["content"]}, {"role": "user", "content": "And then?"}]
    nexts.append(b)
t = time.time(); b = run_all(nexts); t2 = time.time() - t
print(json.dumps({"first_prompt_tokens": [x["usage"]["prompt_tokens"] for x in a], "first_turns_s": round(t1, 1),
                  "second_prompt_tokens": [x["usage"]["prompt_tokens"] for x in b],
                  "second_cached": [x["usage"]["prompt_tokens_details"]["cached_tokens"] for x in b], "second_turns_s": round(t2, 1), "rss_mb": rss()}))
p.kill(); p.wait()
