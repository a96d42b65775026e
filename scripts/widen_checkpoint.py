#!/usr/bin/env python3
"""Writes a Llama checkpoint of a larger shape that computes what a smaller one computes:
for measuring a draft model beside a target several times its cost (speculative decoding)
where no trained target of that size is at hand (not committed output, not in CI).

The small model's weights go into the top-left corner of each wider matrix and the rest is
zero, so the residual stream's extra dimensions stay zero, the extra query heads attend
with zero weights, and the extra MLP rows add nothing: the logits are the small model's
up to rounding. RMSNorm divides by the mean over all dimensions, so each norm's weights
are scaled by sqrt(small / wide) and epsilon by small / wide, which gives the small
model's normalization exactly. Query heads keep their key/value head: with the small
model's g query heads per KV head and the wide one's G >= g, small head h goes to wide
head G * (h // g) + h % g. Decoding reads every weight whatever its value, so the wide
model's speed is that of its shape.

usage: python3 scripts/widen_checkpoint.py SMALL_DIR OUT_DIR [--hidden 2048]
           [--intermediate 8192] [--heads 32] [--kv-heads 8]
(the small model's layer count and head size are kept; Llama, bf16 safetensors, one file)
needs: numpy
"""
import argparse, json, math, os, shutil, struct

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "BF16", f"{name}: {meta['dtype']}, not BF16"
        start, end = meta["data_offsets"]
        tensors[name] = np.frombuffer(data[start:end], dtype=np.uint16).reshape(meta["shape"])
    return tensors


def bf16_scaled(bits, factor):
    """bf16 bits times `factor`, rounded to nearest even bf16."""
    f = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(factor)
    u = f.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("small")
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    a = ap.parse_args()
    config = json.load(open(os.path.join(a.small, "config.json")))
    assert config["architectures"] == ["LlamaForCausalLM"], config["architectures"]
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    dim = config.get("head_dim", h // heads)
    group, wide_group = heads // kv, a.heads // a.kv_heads
    assert a.hidden == a.heads * dim and a.hidden >= h and a.intermediate >= inter
    assert a.kv_heads >= kv and wide_group >= group
    head_to = [wide_group * (q // group) + q % group for q in range(heads)]
    norm_scale = math.sqrt(h / a.hidden)

    small = read_safetensors(os.path.join(a.small, "model.safetensors"))

    def widened(name, t):
        out = np.zeros(shape_of(name, t.shape, a, dim), np.uint16)
        kind = name.split(".")[-2]
        if name.endswith("norm.weight"):
            out[:h] = bf16_scaled(t, norm_scale)
        elif kind in ("q_proj", "o_proj"):
            for q, w in enumerate(head_to):
                small_head = slice(q * dim, (q + 1) * dim)
                wide_head = slice(w * dim, (w + 1) * dim)
                if kind == "q_proj":
                    out[wide_head, :h] = t[small_head]
                else:
                    out[:h, wide_head] = t[:, small_head]
        else:
            # Embeddings, k and v (whose heads keep their places), the MLP: the corner.
            out[tuple(slice(0, n) for n in t.shape)] = t
        return out

    # Shapes first (the header), then each tensor written as it is made.
    names = sorted(small)
    header, offset = {}, 0
    for name in names:
        shape = shape_of(name, small[name].shape, a, dim)
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    os.makedirs(a.out, exist_ok=True)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            f.write(widened(name, small[name]).tobytes())
    config.update(hidden_size=a.hidden, intermediate_size=a.intermediate,
                  num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                  head_dim=dim, rms_norm_eps=config["rms_norm_eps"] * h / a.hidden)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(a.small, extra)):
            shutil.copy(os.path.join(a.small, extra), a.out)
    print(f"wrote {a.out}: {offset / 1e9:.2f} GB of bf16, {offset // 2 / 1e9:.2f}B parameters")


def shape_of(name, shape, a, dim):
    """The wide shape of the small model's tensor `name` (of `shape`)."""
    if name.endswith("norm.weight"):
        return (a.hidden,)
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return (shape[0], a.hidden)
    shapes = {
        "q_proj": (a.hidden, a.hidden),
        "k_proj": (a.kv_heads * dim, a.hidden),
        "v_proj": (a.kv_heads * dim, a.hidden),
        "o_proj": (a.hidden, a.hidden),
        "gate_proj": (a.intermediate, a.hidden),
        "up_proj": (a.intermediate, a.hidden),
        "down_proj": (a.hidden, a.intermediate),
    }
    kind = name.split(".")[-2]
    if kind not in shapes:
        raise SystemExit(f"{name}: not a Llama tensor this script knows")
    return shapes[kind]


if __name__ == "__main__":
    main()
