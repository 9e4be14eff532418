#!/usr/bin/env python3
"""Makes the tiny Hugging Face model folders under tests/data/hf/ and their float64 logits.

Each folder is a random-weight model made by Hugging Face `transformers` (CPU torch), saved as
transformers saves real checkpoints (config.json, *.safetensors, tokenizer.json,
tokenizer_config.json); `oracle.json` holds the logits transformers computes in float64 from
the saved weights for fixed token ids. tests/test_convert.cpp converts each folder with
`ferry convert` and compares ferry's logits with these.

    llama  LlamaForCausalLM, Llama 3.1 "llama3" rope scaling (so rope_freqs.weight), GQA,
           untied output, F16 weights in two shards (model.safetensors.index.json)
    qwen2  Qwen2ForCausalLM, Q/K/V biases, tied embeddings, BF16
    qwen3  Qwen3ForCausalLM, per-head Q/K RMS norms, head_dim != hidden/heads, tied, BF16;
           its rows (256) are a multiple of 256, so K-quant types apply without fallback

llama and qwen2 have rows of 64 elements, not a multiple of 256 (the K-quant block), so a
K-quant conversion of them exercises the fallback types.

Norm weights and biases are randomised (transformers initialises them to ones and zeros, which
would let a converter or loader that drops them pass). Vocabularies are the first 300 tokens of
the real Llama 3 / Qwen3 tokenizers (../shared/fixtures/tokenizers) with the merges among them,
plus a few special tokens.

Requirements (in a venv): torch (CPU), transformers, safetensors. Used to make the committed
files: torch 2.15.0 (PyPI wheel installed with --no-deps: no CUDA libraries), transformers and
safetensors from PyPI. Run from the repository root:
    .venv/bin/python tests/data/make-hf-oracles.py
"""
import gzip
import json
import os
import shutil
import sys

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "hf")
FIXTURES = os.path.join(ROOT, "..", "shared", "fixtures", "tokenizers")
N_BASE = 300  # tokens kept from the real vocabulary
TOKENS = [1, 17, 299, 42, 256, 300, 7, 150, 64, 301, 3, 88]  # includes special ids


def tiny_tokenizer(family, dst):
    """Writes tokenizer.json / tokenizer_config.json with the first N_BASE tokens of `family`."""
    src = json.load(gzip.open(os.path.join(FIXTURES, family, "tokenizer.json.gz"), "rt"))
    vocab = {t: i for t, i in src["model"]["vocab"].items() if i < N_BASE}
    merges = []
    for m in src["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    if family == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = []
    for k, s in enumerate(specials):
        added.append({"id": N_BASE + k, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tok = dict(src)
    tok["added_tokens"] = added
    tok["model"] = dict(src["model"], vocab=vocab, merges=merges)
    with open(os.path.join(dst, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg = json.load(open(os.path.join(FIXTURES, family, "tokenizer_config.json")))
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                   for a in added}
    if family == "qwen3":
        cfg["additional_special_tokens"] = specials[1:]
        cfg["pad_token"] = specials[0]
        cfg["eos_token"] = specials[2]
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


def randomise(model, gen):
    # Norm weights around 1 and biases around 0, but never exactly those.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))


def make(name, cls, config, family, dtype, shard=None, classic_config=False):
    dst = os.path.join(OUT, name)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(4321)
    model = cls(config).to(torch.float64)
    randomise(model, gen)
    model = model.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(dst, safe_serialization=True, **kw)
    for f in ("generation_config.json",):
        if os.path.exists(os.path.join(dst, f)):
            os.remove(os.path.join(dst, f))
    tiny_tokenizer(family, dst)
    if classic_config:
        # The published Llama 3.x checkpoints were saved by transformers 4: rope_theta and
        # rope_scaling at the top level (transformers 5 nests both in rope_parameters). The
        # converter reads both forms; llama's folder keeps the older one, the qwen folders the
        # newer.
        path = os.path.join(dst, "config.json")
        cfg = json.load(open(path))
        rp = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rp.pop("rope_theta")
        cfg["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    # The oracle: the saved weights, read back and computed in float64.
    ref = cls.from_pretrained(dst, torch_dtype=torch.float64, attn_implementation="eager")
    ref.eval()
    with torch.no_grad():
        logits = ref(torch.tensor([TOKENS])).logits[0]
    oracle = {
        "about": "float64 logits from transformers %s, torch %s (tests/data/make-hf-oracles.py)"
                 % (transformers.__version__, torch.__version__),
        "tokens": TOKENS,
        "logits": [[float("%.17g" % v) for v in row.tolist()] for row in logits],
    }
    with open(os.path.join(dst, "oracle.json"), "w") as f:
        json.dump(oracle, f)
    size = sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst))
    print("%s: %d files, %d bytes" % (name, len(os.listdir(dst)), size))


def main():
    n_vocab = N_BASE + 4  # one id past the specials is never set: a [PAD] token
    common = dict(vocab_size=n_vocab, max_position_embeddings=256, initializer_range=0.1,
                  hidden_act="silu")
    make("llama", transformers.LlamaForCausalLM, transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        bos_token_id=N_BASE, eos_token_id=N_BASE + 1, **common), "llama3", torch.float16,
        shard="150KB", classic_config=True)
    make("qwen2", transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False, **common), "qwen3", torch.bfloat16)
    make("qwen3", transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, **common), "qwen3", torch.bfloat16)


if __name__ == "__main__":
    sys.exit(main())
