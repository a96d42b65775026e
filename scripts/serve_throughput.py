#!/usr/bin/env python3
"""Aggregate decoding speed of `runtime serve` under N concurrent clients, greedy and
sampled, alternated: each client asks one non-streamed chat completion of MAX_TOKENS tokens
(OpenAI's defaults otherwise: no top-k, top-p 1), the end-of-text token banned through
`logit_bias` so that every answer is the same length. Aggregate tok/s = all completion
tokens / wall time from the first request sent to the last answer; prefill included, as a
client sees it.

usage: serve_throughput.py RUNTIME_BINARY ARTIFACT_DIR [CLIENTS=1,8] [TEMPERATURES=0,0.8]
                           [ROUNDS=3] [MAX_TOKENS=200]
"""
import json
import sys
import threading
import time

from serve_client import post, start

binary, artifacts = sys.argv[1], sys.argv[2]
clients = [int(c) for c in (sys.argv[3] if len(sys.argv) > 3 else "1,8").split(",")]
temperatures = [float(t) for t in (sys.argv[4] if len(sys.argv) > 4 else "0,0.8").split(",")]
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
max_tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 200

process, base = start(binary, artifacts, "--parallel", str(max(clients)))
try:
    # The end-of-text token's id: the one a greedy answer of a few tokens stops on.
    config = json.load(open(f"{artifacts}/config.json"))
    eos = config["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos

    def ask(temperature, tokens, results, i):
        body = {"messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}],
                "temperature": temperature, "max_tokens": tokens,
                "logit_bias": {str(eos): -100}}
        results[i] = json.load(post(base, body))["usage"]["completion_tokens"]

    def aggregate(n, temperature):
        results = [0] * n
        threads = [threading.Thread(target=ask, args=(temperature, max_tokens, results, i))
                   for i in range(n)]
        t = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(results) / (time.perf_counter() - t)

    aggregate(max(clients), 0.0)  # warm-up
    print(f"| round | {' | '.join(f'{n} clients t={t:g}' for n in clients for t in temperatures)} |")
    print(f"|---|{'---|' * (len(clients) * len(temperatures))}")
    for r in range(rounds):
        cells = [f"{aggregate(n, t):.1f}" for n in clients for t in temperatures]
        print(f"| {r + 1} | {' | '.join(cells)} |", flush=True)
finally:
    process.kill()
    process.wait()
