#!/usr/bin/env python3
"""Converts a hub-layout Llama checkpoint (config.json, model.safetensors or a sharded
model.safetensors.index.json, a byte-level BPE tokenizer.json) to GGUF for llama.cpp, and
quantizes it with llama.cpp itself: the files we measure llama.cpp on, for checkpoints
such as scripts/make_random_checkpoint.py's.

Why not llama.cpp's convert_hf_to_gguf.py: it needs torch and transformers, which these
machines lack. This writes what it writes for LlamaForCausalLM: its tensor names, the q/k
row permutation (weights and biases), norms, biases and `rope_freqs` in F32, the other
tensors in `--type` (bf16: the source's bf16 bits copied, no rounding; f32), the same
hyperparameter keys, and `tokenizer.ggml.*` from tokenizer.json with gguf-py's SpecialVocab
for merges and special ids. RoPE scaling as convert_hf_to_gguf.py writes it: `linear` as
`rope.scaling.type`/`factor`; Llama 3.1's `llama3` only as the `rope_freqs` tensor of
per-frequency divisors (factor, low/high frequency factors and original context baked in),
with no `rope.scaling.*` keys, since llama.cpp would apply a scaling factor there on top.
The tokenizer's pre-tokenizer name (`tokenizer.ggml.pre`) is taken from its Split regex
(Llama 3's: `llama-bpe`); `--pre NAME` names another.

usage: python3 scripts/checkpoint_to_gguf.py CHECKPOINT_DIR OUT_DIR [--type bf16|f32]
           [--quantize Q8_0,Q4_K_M,Q4_0] [--pre NAME]
writes: OUT_DIR/bf16.gguf (or f32.gguf), and OUT_DIR/q8_0.gguf etc. for each --quantize
type, each made from the first by llama.cpp's `llama_model_quantize`
needs: numpy, gguf (gguf-py), llama-cpp-python for --quantize (the llama.cpp venv, e.g.
target/llamacpp/venv); no torch
"""
import argparse, json, math, os, sys
from pathlib import Path

import numpy as np
import gguf
from gguf.utility import SafetensorsLocal

sys.path.insert(0, os.path.dirname(__file__))
from gguf_llama import add_gpt2_vocab, gguf_name, permute, quantize  # noqa: E402

ARCHITECTURES = ("LlamaForCausalLM",)
# tokenizer.json Split regex -> llama.cpp's pre-tokenizer name (llama-vocab.cpp)
PRE_TOKENIZERS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}
OUT_TYPES = {
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
}
CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "max_position_embeddings", "rms_norm_eps", "vocab_size")
SOURCE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


class Fail(Exception):
    """A problem with the input, reported as one line."""


class Deferred:
    """A tensor the GGUF writer pulls when it writes it, so only one tensor is in memory
    at a time (the writer needs shape, dtype, nbytes and tofile)."""

    def __init__(self, shape, dtype, make):
        self.shape, self.dtype, self.make = tuple(shape), np.dtype(dtype), make
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def tofile(self, f):
        data = self.make()
        assert data.shape == self.shape and data.dtype == self.dtype, (data.shape, data.dtype)
        data.tofile(f)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise Fail(f"{path} not found") from None
    except json.JSONDecodeError as e:
        raise Fail(f"{path} is not JSON: {e}") from None


def source_tensors(checkpoint):
    """name -> gguf LocalTensor (a memory-mappable byte range), in convert_hf_to_gguf.py's
    order: parts sorted by file name, tensors by name within each."""
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise Fail(f"{index} has no weight_map")
        parts = sorted(set(weight_map.values()))
    elif (checkpoint / "model.safetensors").is_file():
        weight_map, parts = None, ["model.safetensors"]
    else:
        raise Fail(f"{checkpoint} has neither model.safetensors nor model.safetensors.index.json")
    tensors = {}
    for part in parts:
        path = checkpoint / part
        if not path.is_file():
            raise Fail(f"{path}, named by the index, not found")
        tensors.update(SafetensorsLocal(path).tensors)
    if weight_map is not None and set(weight_map) != set(tensors):
        raise Fail(f"the index and the shards name different tensors: {sorted(set(weight_map) ^ set(tensors))[:5]}")
    return tensors


def as_f32(values, dtype):
    if dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def converted(tensor, qtype, n_head_permute):
    """The tensor as written: q/k rows permuted, then F32 or BF16 (BF16 from a BF16 source
    is its bits unchanged; from F32/F16 rounded by gguf-py, as convert_hf_to_gguf.py does)."""
    if tensor.dtype not in SOURCE_DTYPES:
        raise Fail(f"tensor dtype {tensor.dtype} is not one of {sorted(SOURCE_DTYPES)}")

    def make():
        values = tensor.mmap_bytes().view(SOURCE_DTYPES[tensor.dtype]).reshape(tensor.shape)
        if n_head_permute:
            values = permute(values, n_head_permute)
        if qtype == gguf.GGMLQuantizationType.BF16 and tensor.dtype == "BF16":
            return np.ascontiguousarray(values)
        values = as_f32(values, tensor.dtype)
        if qtype == gguf.GGMLQuantizationType.F32:
            return np.ascontiguousarray(values)
        bits = gguf.quants.quantize(values, qtype)  # uint8 bytes, last axis doubled
        return bits.view("<u2").reshape(tensor.shape)

    dtype = np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.uint16
    return Deferred(tensor.shape, dtype, make)


def rope_settings(config):
    """(theta, type, parameters) with convert_hf_to_gguf.py's fallbacks: `rope_parameters`
    or `rope_scaling`, `type` for `rope_type`, theta and original context from the root."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "full_attention" in rope or "sliding_attention" in rope:
        raise Fail("per-layer-type rope_parameters are not a Llama's")
    rope.setdefault("rope_theta", config.get("rope_theta"))
    if "original_max_position_embeddings" in config:
        rope.setdefault("original_max_position_embeddings", config["original_max_position_embeddings"])
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    return rope["rope_theta"], rope_type, rope


def llama3_rope_freqs(rope, head_dim):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: per rotary frequency, the
    divisor Llama 3.1 scaling applies (1 for short wavelengths, `factor` for long ones,
    smoothly between), in float32 arithmetic as there."""
    base = rope["rope_theta"] if rope["rope_theta"] is not None else 10000.0
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = rope.get("factor", 8.0)
    low = rope.get("low_freq_factor", 1.0)
    high = rope.get("high_freq_factor", 4.0)
    old_context = rope.get("original_max_position_embeddings", 8192)
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    divisors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            divisors.append(1)
        elif wavelen > low_freq_wavelen:
            divisors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def pre_tokenizer_name(tok_json):
    pre = tok_json.get("pre_tokenizer") or {}
    for p in pre.get("pretokenizers", [pre]):
        regex = (p.get("pattern") or {}).get("Regex") if p.get("type") == "Split" else None
        if regex in PRE_TOKENIZERS:
            return PRE_TOKENIZERS[regex]
    raise Fail("tokenizer.json's pre-tokenizer regex is not one this knows (Llama 3's, Qwen2's): "
               "pass --pre with llama.cpp's name for it")


def write_gguf(checkpoint, path, out_type, pre):
    config = read_json(checkpoint / "config.json")
    arch = (config.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise Fail(f"config.json's architecture is {arch}; this converts {', '.join(ARCHITECTURES)}")
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise Fail(f"config.json lacks {', '.join(missing)}")
    tok_json = read_json(checkpoint / "tokenizer.json")
    if tok_json.get("model", {}).get("type") != "BPE":
        raise Fail(f"tokenizer.json's model is {tok_json.get('model', {}).get('type')}, not byte-level BPE")
    n_head, n_kv_head = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    theta, rope_type, rope = rope_settings(config)
    if rope_type not in ("default", "linear", "llama3"):
        raise Fail(f"RoPE type {rope_type!r} is not one this writes (default, linear, llama3)")
    qtype, file_type = OUT_TYPES[out_type]

    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    if rope_type == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, head_dim))
    for name, tensor in source_tensors(checkpoint).items():
        if name.endswith(".rotary_emb.inv_freq"):
            continue
        try:
            out_name = gguf_name(name)
        except KeyError:
            raise Fail(f"tensor {name} has no llama.cpp name (not a Llama tensor)") from None
        n_head_permute = None
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            n_head_permute = n_head
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            n_head_permute = n_kv_head
        # convert_hf_to_gguf.py keeps 1-D tensors, norms and non-weights in F32
        keep_f32 = len(tensor.shape) <= 1 or out_name.endswith("_norm.weight") or not out_name.endswith(".weight")
        t_type = gguf.GGMLQuantizationType.F32 if keep_f32 else qtype
        w.add_tensor(out_name, converted(tensor, t_type, n_head_permute), raw_dtype=t_type)

    total, shared, expert, experts = w.get_total_parameter_count()
    metadata = gguf.Metadata.load(None, checkpoint, None, total)
    metadata.name = metadata.name or checkpoint.resolve().name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(total, shared, expert, experts)
    w.add_type(gguf.GGUFType.MODEL)
    metadata.set_gguf_meta_model(w)

    # convert_hf_to_gguf.py: TextModel.set_gguf_parameters, then LlamaModel's
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv_head)
    if rope_type == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if theta is not None:
        w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim") is not None:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    w.add_file_type(file_type)
    w.add_vocab_size(config["vocab_size"])
    w.add_rope_dimension_count(head_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # LlamaModel.set_vocab -> _set_vocab_gpt2 (a tokenizer.json without sentencepiece)
    tok_config_path = checkpoint / "tokenizer_config.json"
    if tok_config_path.is_file():
        add_prefix_space = read_json(tok_config_path).get("add_prefix_space")
        if add_prefix_space is not None:
            w.add_add_space_prefix(add_prefix_space)
    try:
        add_gpt2_vocab(w, tok_json, config["vocab_size"], pre or pre_tokenizer_name(tok_json))
    except ValueError as e:
        raise Fail(str(e)) from None
    gguf.SpecialVocab(checkpoint, load_merges=True).add_to_gguf(w, quiet=True)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quant_ftypes(spec):
    import llama_cpp
    ftypes = {}
    for name in filter(None, (s.strip().upper() for s in spec.split(","))):
        ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", None)
        if ftype is None:
            raise Fail(f"--quantize {name}: llama.cpp has no LLAMA_FTYPE_MOSTLY_{name}")
        ftypes[name] = ftype
    return ftypes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--type", choices=sorted(OUT_TYPES), default="bf16")
    parser.add_argument("--quantize", default="", help="comma-separated llama.cpp types, e.g. Q8_0,Q4_K_M,Q4_0")
    parser.add_argument("--pre", help="tokenizer.ggml.pre, when tokenizer.json's regex is not recognised")
    args = parser.parse_args()
    try:
        ftypes = quant_ftypes(args.quantize) if args.quantize else {}
        args.out_dir.mkdir(parents=True, exist_ok=True)
        base = args.out_dir / f"{args.type}.gguf"
        write_gguf(args.checkpoint, base, args.type, args.pre)
        print(f"wrote {base} ({base.stat().st_size / 1e6:.1f} MB)")
        for name, ftype in ftypes.items():
            out = args.out_dir / f"{name.lower()}.gguf"
            quantize(str(base), str(out), ftype)
            print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    except (Fail, RuntimeError) as e:
        sys.exit(f"checkpoint_to_gguf: {e}")


if __name__ == "__main__":
    main()
