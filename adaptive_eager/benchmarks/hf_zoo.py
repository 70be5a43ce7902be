"""Hugging Face models with capture forced: fused share, compile failures, losses vs eager.

Tiny configs with random init (no downloads): each model trains ``--steps`` AdamW steps
on one batch of ``--batch`` x ``--seq`` tokens, eagerly and then under adaptive_eager with
capture forced (``adaptive_passthrough=False``, ``warmup=False``) and synchronous
compiles; ``--trainer`` runs ``transformers.Trainer`` on GPT-2 instead (needs accelerate).
``--backend decompositions`` is AOTAutograd with Inductor's decompositions and no code
generation (Inductor's layouts in a fraction of its compile time), registered as a
debugging backend (never demoted for speed). Beside the whole run's fused share it prints
the later half's (``steps 5-8``): a window's first sighting and its first compiled call
run eagerly, and the first step's windows (the model's construction, AdamW's state
creation) differ from the rest, so the first three steps bound the whole run's share.
The share is of every op the program ran on the device (fused, replayed eagerly, passed
through), warm-up included. Each run compiles into a fresh disk cache (``--cache-dir
default``: the runtime's own, where an earlier run's regions load instead). Issue 27.

    python -m benchmarks.hf_zoo --models gpt2,llama,bert,t5 --backend inductor --attn eager
    python -m benchmarks.hf_zoo --trainer --backend inductor
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch

V = 128


def build(name: str, attn: str | None) -> torch.nn.Module:
    import transformers as T

    T.logging.set_verbosity_error()
    kw: dict[str, Any] = {} if attn is None else {"attn_implementation": attn}
    dec = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, pad_token_id=0,
               bos_token_id=None, eos_token_id=None, **kw)
    torch.manual_seed(0)
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V,
                                              n_positions=64, pad_token_id=0, **kw))
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**dec))
    if name == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(sliding_window=None, **dec))
    if name == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**dec))
    if name == "bert":
        return T.BertForMaskedLM(T.BertConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            vocab_size=V, max_position_embeddings=64, **kw))
    if name == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16,
            vocab_size=V, decoder_start_token_id=0, pad_token_id=0, **kw))
    if name == "bart":
        return T.BartForConditionalGeneration(T.BartConfig(
            encoder_layers=2, decoder_layers=2, d_model=64, encoder_ffn_dim=128,
            decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4,
            vocab_size=V, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=2, **kw))
    raise SystemExit(f"unknown model {name!r}")


def _ops() -> tuple[int, int]:
    """(ops fused, ops run) so far: the runtime's counters (zeros when it is off). Ops run
    are every op the program ran on the device: fused, replayed eagerly, and passed
    straight through (a sync op, ``.item()``'s read), so the share is of what the program
    ran, warm-up included."""
    from adaptive_eager import stats

    s = stats()
    return s.ops_fused, s.ops_fused + s.ops_eager + s.ops_passthrough


def train(name: str, args: argparse.Namespace, marks: list | None = None) -> list[float]:
    """The losses of ``args.steps`` AdamW steps; ``marks`` gets :func:`_ops` after each."""
    model = build(name, args.attn).eval()  # eval: no dropout, eager and capture agree
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (args.batch, args.seq), generator=g)
    kw = {"input_ids": ids, "labels": ids}
    if name == "t5":
        kw["decoder_input_ids"] = torch.randint(3, V, (args.batch, args.seq), generator=g)
    losses = []
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = model(**kw).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if marks is not None:
            marks.append(_ops())
    return losses


def trainer(name: str, args: argparse.Namespace, marks: list | None = None) -> list[float]:
    """The losses of ``transformers.Trainer`` on GPT-2 with ``--optim`` (the Trainer's own
    default when None: ``adamw_torch_fused`` from torch 2.8 on, i.e. ``AdamW(fused=True)``)."""
    import transformers as T

    class Marks(T.TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            if marks is not None:
                marks.append(_ops())

    model = build("gpt2", args.attn)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(1, V, (args.steps * args.batch, args.seq), generator=g)
    data = [{"input_ids": r.clone(), "labels": r.clone()} for r in rows]  # a tensor each
    with tempfile.TemporaryDirectory() as d:
        targs = T.TrainingArguments(output_dir=d, max_steps=args.steps, logging_steps=1,
                                    per_device_train_batch_size=args.batch, report_to=[],
                                    save_strategy="no", use_cpu=True, seed=0,
                                    dataloader_num_workers=0, disable_tqdm=True, learning_rate=1e-3,
                                    **({} if args.optim is None else {"optim": args.optim}))
        tr = T.Trainer(model=model, args=targs, train_dataset=data, callbacks=[Marks()])
        tr.train()
    return [h["loss"] for h in tr.state.log_history if "loss" in h]


def _decompositions_backend() -> str:
    from adaptive_eager.fusion.policy import OpSupport
    from adaptive_eager.runtime import register_backend

    def decomposing(gm: Any, example_inputs: list) -> Any:
        from torch._dynamo.backends.debugging import aot_eager_decomp_partition

        with torch.no_grad():
            return aot_eager_decomp_partition(gm, example_inputs)

    def table() -> Any:
        from torch._inductor.decomposition import select_decomp_table

        return select_decomp_table()

    decomposing.decompositions = table  # type: ignore[attr-defined]
    register_backend("decompositions", decomposing, OpSupport(factories=False), debugging=True)
    return "decompositions"


def _later(marks: list) -> str:
    """The fused share of the later half of the steps (past the warm-up: a window's first
    two sightings and its first compiled call run eagerly)."""
    half = len(marks) // 2
    if half == 0:
        return "-"
    (f0, n0), (f1, n1) = marks[half - 1], marks[-1]
    share = f"{(f1 - f0) / (n1 - n0):.0%}" if n1 > n0 else "-"
    return f"steps {half + 1}-{len(marks)}: {share}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,llama,bert,t5,mistral,qwen2,bart")
    p.add_argument("--backend", default="inductor")
    p.add_argument("--attn", default=None,
                   help="eager or sdpa (default: the model's own, sdpa where it has one)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--trainer", action="store_true", help="transformers.Trainer on GPT-2")
    p.add_argument("--optim", default=None,
                   help="the Trainer's optim (default: its own, adamw_torch_fused on torch >= 2.8)")
    p.add_argument("--cache-dir", default=None,
                   help="compiled-region disk cache: default a fresh temporary folder (every "
                        "region compiles in this run); 'default' for the runtime's own")
    args = p.parse_args()
    import adaptive_eager as ae
    from adaptive_eager import session

    backend = _decompositions_backend() if args.backend == "decompositions" else args.backend
    run = trainer if args.trainer else train
    print(f"load average at start: {_load()}", flush=True)
    for name in ["gpt2 (Trainer)"] if args.trainer else args.models.split(","):
        ref = run(name, args)
        session.clear_sessions()
        ae.reset_stats()
        t0 = time.perf_counter()
        marks: list = []
        with tempfile.TemporaryDirectory() as fresh:
            cache = {} if args.cache_dir == "default" else {"cache_dir": args.cache_dir or fresh}
            with ae.adaptive_eager(backend=backend, async_compile=False,
                                   adaptive_passthrough=False, warmup=False, **cache):
                got = run(name, args, marks)
        s = ae.stats()
        reasons = sorted({r for rs in s.fallback_reasons.values() for r in rs})
        diff = max(abs(a - b) for a, b in zip(got, ref))
        fused, ran = s.ops_fused, s.ops_fused + s.ops_eager + s.ops_passthrough  # as _ops
        steps = {k: v for k, v in s.optimizer_step_kinds.items()}
        print(f"{name:15s} attn={args.attn} backend={args.backend} steps={args.steps} "
              f"fused={fused / ran:.0%} ({_later(marks)}) compile_failures={s.compile_failures} "
              f"max|loss-eager|={diff:.1e} {time.perf_counter() - t0:.0f}s\n"
              f"    compiled={s.regions_compiled} from_disk={s.regions_from_disk} "
              f"demoted={s.demotions} passed_through={s.ops_passthrough} fallbacks={reasons} "
              f"optimizer={steps} load={_load()}", flush=True)


def _load() -> str:
    """The 1, 5 and 15 minute load averages (the machine is shared)."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
