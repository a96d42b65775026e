#!/usr/bin/env python3
"""The official `openai` client's `embeddings.create` against `runtime serve` (run by
serve_embeddings.rs's `openai_python_client_embeds`): the client's default request (it asks
for base64 and decodes it) and `encoding_format="float"` give the same vectors, each within
1e-5 of sentence-transformers' (the fixture's embeddings.json); usage counts the tokens; a
refused `dimensions` raises the client's typed error naming the field.

usage: openai_embeddings.py BASE_URL API_KEY EMBEDDINGS_JSON
"""
import json
import sys

import openai

base_url, api_key, fixture_path = sys.argv[1:4]
fixture = json.load(open(fixture_path))
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
model = client.models.list().data[0].id
texts = fixture["texts"]

decoded = client.embeddings.create(model=model, input=texts)
floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
for answer in (decoded, floats):
    assert [d.index for d in answer.data] == list(range(len(texts))), answer
    tokens = sum(len(ids) for ids in fixture["ids"])
    assert answer.usage.prompt_tokens == tokens == answer.usage.total_tokens, answer.usage
for i, expected in enumerate(fixture["embeddings"]):
    a, b = decoded.data[i].embedding, floats.data[i].embedding
    assert len(a) == len(expected), (i, len(a))
    # base64 holds the f32 values themselves: the same numbers as the float answer.
    assert a == b, (i, a[:4], b[:4])
    worst = max(abs(x - y) for x, y in zip(a, expected))
    assert worst <= 1e-5, (i, worst)

one = client.embeddings.create(model=model, input=texts[1], encoding_format="float")
assert one.data[0].embedding == floats.data[1].embedding

try:
    client.embeddings.create(model=model, input=texts[0], dimensions=8)
    raise AssertionError("dimensions 8 accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.body["param"] == "dimensions", e.body
print("openai embeddings: ok")
