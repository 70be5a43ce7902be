"""Tiny Hugging Face models (random init from small configs, no downloaded weights).

Helpers for tests/test_models.py: build a model, make its inputs, run one forward and
backward step and return what should match eager (logits, loss, parameter grads).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

VOCAB = 128
SEQ = 16
BATCH = 2


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def gpt2() -> torch.nn.Module:
    T = _transformers()
    return T.GPT2LMHeadModel(T.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
        attn_implementation="eager", pad_token_id=0))


def llama() -> torch.nn.Module:
    T = _transformers()
    return T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        attn_implementation="eager", pad_token_id=0, bos_token_id=None, eos_token_id=None))


def bert() -> torch.nn.Module:
    T = _transformers()
    return T.BertForMaskedLM(T.BertConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=64, attn_implementation="eager"))


def t5() -> torch.nn.Module:
    T = _transformers()
    return T.T5ForConditionalGeneration(T.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16,
        vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0))


def mistral() -> torch.nn.Module:
    """Grouped-query attention (2 key/value heads for 4), SDPA attention (the default)."""
    T = _transformers()
    return T.MistralForCausalLM(T.MistralConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, sliding_window=None,
        pad_token_id=0, bos_token_id=None, eos_token_id=None))


def qwen2() -> torch.nn.Module:
    """Grouped-query attention with q/k/v biases, SDPA attention (the default)."""
    T = _transformers()
    return T.Qwen2ForCausalLM(T.Qwen2Config(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=None, eos_token_id=None))


def bart() -> torch.nn.Module:
    """An encoder-decoder with learned positions, SDPA attention (the default)."""
    T = _transformers()
    return T.BartForConditionalGeneration(T.BartConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
        encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=VOCAB,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=2))


ZOO: dict[str, Callable[[], torch.nn.Module]] = {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5}
# More architectures, for the fusion test over the zoo (tests/test_models_fused.py)
MORE: dict[str, Callable[[], torch.nn.Module]] = {"mistral": mistral, "qwen2": qwen2, "bart": bart}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The model, eval mode (no dropout: eager and the runtime must agree exactly)."""
    torch.manual_seed(seed)
    return {**ZOO, **MORE}[name]().eval()


def inputs(name: str, seed: int = 1) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
    kw: dict[str, Any] = {"input_ids": ids, "labels": ids}
    if name == "t5":
        kw["decoder_input_ids"] = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
    return kw


def train_step(model: torch.nn.Module, kw: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Forward and backward; logits, loss and every parameter's grad, detached copies."""
    model.zero_grad(set_to_none=True)
    out = model(**kw)
    out.loss.backward()
    res = {"logits": out.logits.detach().clone(), "loss": out.loss.detach().clone()}
    for n, p in model.named_parameters():
        if p.grad is not None:
            res["grad:" + n] = p.grad.detach().clone()
    return res


def generate(model: torch.nn.Module, new_tokens: int = 6) -> torch.Tensor:
    """Greedy decoding with a static KV cache."""
    ids = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          do_sample=False, cache_implementation="static")
