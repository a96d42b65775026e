#!/usr/bin/env python3
"""GGUF fixtures beyond SmolLM2 for converter/tests/tiny_logits.rs: a Llama 3 style GGUF
(`llama-bpe` pre-tokenizer, BOS added, attention biases, which llama.cpp's converter
permutes with their weights), a Qwen2 one (`qwen2` pre-tokenizer, q/k/v biases) and a Qwen3
one (head norms, head_dim 128 ≠ hidden / heads), each K-quantized by llama.cpp itself.

For each: a tiny random model (one layer, hidden 256 so K-quant rows are whole 256-value
super-blocks) is written as an F32 GGUF the way llama.cpp's convert_hf_to_gguf.py writes
one (its tensor names, Llama's q/k row permutation, biases for Qwen2, the tokenizer as
`tokenizer.ggml.*` from the byte-level BPE tokenizer.json of the family fixtures), then
quantized with llama.cpp's `llama_model_quantize` (Llama: Q4_K_M, so Q4_K and Q6_K
tensors; Qwen2: Q3_K_M, so Q3_K, Q4_K and Q5_K). The expected logits are transformers' on
the weights gguf-py dequantizes from the quantized file, rounded to bf16 as the importer
rounds them, and the tokenizer.json the importer must reproduce is saved next to it;
llama.cpp's own tokenization of the GGUF is checked against it on the tokenizer oracle's
strings before anything is written.

usage: python3 scripts/make_gguf_fixtures.py converter/tests/data [NAME...]
writes: gguf-llama-bpe/, gguf-qwen2/ and gguf-qwen3/ (or the NAMEs given), each model.gguf, tokenizer.json (the source
tokenizer), fixture.json (ids of a fixed text) and logits.bin ([ids, vocab] f32 LE)
needs: torch, transformers, tokenizers, gguf, llama-cpp-python (the oracle venv)
"""
import json, os, sys, tempfile

import numpy as np
import torch
import tokenizers
import transformers
import gguf
import llama_cpp

sys.path.insert(0, os.path.dirname(__file__))
from make_tiny_fixture import SEQUENCE_TEXT, randomise  # noqa: E402
from gguf_llama import add_gpt2_vocab, gguf_name, permute, quantize, unpermute  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
ORACLE = os.path.join(ROOT, "runtime/tests/data/tokenizer_oracle.json")


def write_f32_gguf(path, arch, config, state, tok_json, pre, add_bos):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    if head_dim != config.hidden_size // config.num_attention_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(config.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # The tokenizer as convert_hf_to_gguf.py's `_set_vocab_gpt2` writes it.
    tokens = add_gpt2_vocab(w, tok_json, config.vocab_size, pre)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    w.add_token_merges(merges)
    w.add_bos_token_id(config.bos_token_id)
    w.add_eos_token_id(config.eos_token_id)
    w.add_add_bos_token(add_bos)
    for name, tensor in state.items():
        data = tensor.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, config.num_attention_heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, config.num_key_value_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def dequantized_state(path, arch, config):
    """The quantized GGUF's tensors as the importer produces them: dequantized by gguf-py,
    q/k un-permuted (Llama), rounded to bf16."""
    reader = gguf.GGUFReader(path)
    names = {gguf_name(hf): hf for hf in LlamaLike(config).state_names()}
    state, types = {}, set()
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        values = values.reshape([int(d) for d in reversed(t.shape)])
        hf = names[t.name]
        if arch == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
            values = unpermute(values, config.num_attention_heads)
        if arch == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
            values = unpermute(values, config.num_key_value_heads)
        state[hf] = torch.from_numpy(np.array(values, dtype=np.float32)).to(torch.bfloat16).to(torch.float32)
        types.add(t.tensor_type.name)
    return state, sorted(types)


class LlamaLike:
    def __init__(self, config):
        self.config = config

    def state_names(self):
        return list(self.config.model_class(self.config).state_dict().keys())


def check_llama_cpp_tokenizes_alike(gguf_path, tok, strings):
    """llama.cpp's tokenization of the GGUF equals the `tokenizers` library's of the source
    tokenizer.json: the fixture is a faithful GGUF of that tokenizer."""
    llm = llama_cpp.Llama(gguf_path, vocab_only=True, verbose=False)
    for s in strings:
        ours = tok.encode(s).ids
        theirs = llm.tokenize(s.encode(), add_bos=True, special=True)
        assert ours == theirs, (s, ours, theirs)


def make(out_root, name, arch, model_class, config_class, config_args, family_dir, pre, add_bos, ftype):
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    tok_json = json.load(open(os.path.join(out_root, family_dir, "tokenizer.json")))
    if add_bos:  # as Llama 3's tokenizer.json: BOS through a TemplateProcessing
        bos = "<|begin_of_text|>"
        bos_id = tok_json["model"]["vocab"][bos]
        tok_json["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        }
    tok = tokenizers.Tokenizer.from_str(json.dumps(tok_json))
    torch.manual_seed(20261123)
    config = config_class(**config_args)
    config.model_class = model_class
    model = model_class(config).eval()
    randomise(model)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        write_f32_gguf(f32, arch, config, model.state_dict(), tok_json, pre, add_bos)
        quantized = os.path.join(out, "model.gguf")
        quantize(f32, quantized, ftype)
    strings = json.load(open(ORACLE))["cases"] if os.path.exists(ORACLE) else []
    strings = [c["text"] if isinstance(c, dict) else c for c in strings]
    check_llama_cpp_tokenizes_alike(quantized, tok, [SEQUENCE_TEXT] + strings)
    state, types = dequantized_state(quantized, arch, config)
    del config.model_class
    model = model_class(config).eval()
    model.load_state_dict(state)
    ids = tok.encode(SEQUENCE_TEXT).ids[:100]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({
        "made_by": f"scripts/make_gguf_fixtures.py, llama-cpp-python {llama_cpp.__version__}, gguf-py, transformers {transformers.__version__}, torch {torch.__version__}, tokenizers {tokenizers.__version__}",
        "tensor_types": types,
        "tokenizer_strings_checked_with_llama_cpp": 1 + len(strings),
        "ids": ids,
        "vocab_size": config.vocab_size,
    }, open(os.path.join(out, "fixture.json"), "w"), indent=1)
    print(f"wrote {out}: tensor types {types}, {len(ids)} ids")


def main():
    root, wanted = sys.argv[1], sys.argv[2:]
    base = dict(vocab_size=384, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    fixtures = {
        "gguf-llama-bpe": ("llama", transformers.LlamaForCausalLM, transformers.LlamaConfig,
                           dict(base, attention_bias=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
                           "tiny-llama3", "llama-bpe", True, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M),
        "gguf-qwen2": ("qwen2", transformers.Qwen2ForCausalLM, transformers.Qwen2Config,
                       dict(base, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                       "tiny-qwen2", "qwen2", False, llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M),
        # Qwen3 as published: head norms, no biases, head_dim 128 (q 512 wide, hidden 256).
        "gguf-qwen3": ("qwen3", transformers.Qwen3ForCausalLM, transformers.Qwen3Config,
                       dict(base, head_dim=128, use_sliding_window=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                       "tiny-qwen2", "qwen2", False, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M),
    }
    for name, args in fixtures.items():
        if not wanted or name in wanted:
            make(root, name, *args)


if __name__ == "__main__":
    main()
