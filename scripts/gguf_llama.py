"""What scripts/make_gguf_fixtures.py and scripts/checkpoint_to_gguf.py share to write a
GGUF as llama.cpp's convert_hf_to_gguf.py writes one: its tensor names, Llama's q/k row
permutation, the byte-level BPE vocabulary as `tokenizer.ggml.*`, and quantizing with
llama.cpp's own `llama_model_quantize`. Kept free of torch so the converter script runs
where torch is not installed.

needs: gguf; llama-cpp-python for `quantize` only
"""
import ctypes

import gguf


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute (weights and biases alike): llama.cpp
    rotates adjacent pairs, transformers the two halves of each head."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w, n_head):
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.down_proj.bias": "ffn_down.bias",
}


def gguf_name(hf):
    """The GGUF name of a transformers Llama/Qwen2/Qwen3 tensor; KeyError for any other."""
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    parts = hf.split(".", 3)
    if len(parts) != 4 or parts[:2] != ["model", "layers"] or parts[3] not in LAYER_NAMES:
        raise KeyError(hf)
    return f"blk.{parts[2]}.{LAYER_NAMES[parts[3]]}"


def gpt2_vocab(tok_json, vocab_size):
    """The token list and types convert_hf_to_gguf.py's `get_vocab_base` derives from a
    byte-level BPE tokenizer.json: ids the tokenizer lacks become `[PAD{id}]` (UNUSED),
    added tokens CONTROL when special or `<|...|>`-shaped, else USER_DEFINED."""
    by_id = {i: t for t, i in tok_json["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok_json.get("added_tokens", [])}
    by_id.update((i, a["content"]) for i, a in added.items())
    if max(by_id) >= vocab_size:
        raise ValueError(f"tokenizer.json has id {max(by_id)}, past the model's vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = by_id[i]
        tokens.append(token)
        if i not in added:
            types.append(gguf.TokenType.NORMAL)
        elif added[i].get("special") or (token.startswith("<|") and token.endswith("|>")):
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.USER_DEFINED)
    return tokens, types


def add_gpt2_vocab(writer, tok_json, vocab_size, pre):
    """Writes `tokenizer.ggml.{model,pre,tokens,token_type}` as `_set_vocab_gpt2` does; the
    caller adds merges and special ids (convert_hf_to_gguf.py: gguf.SpecialVocab)."""
    if tok_json["model"].get("type") != "BPE":
        raise ValueError(f"tokenizer.json's model is {tok_json['model'].get('type')}, not the byte-level BPE this writes")
    tokens, types = gpt2_vocab(tok_json, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    return tokens


def quantize(src, dst, ftype):
    """Quantizes a GGUF with llama.cpp's own `llama_model_quantize` (ftype: a
    `llama_cpp.LLAMA_FTYPE_*`), so the file is what llama-quantize would write."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} failed: {rc}")
