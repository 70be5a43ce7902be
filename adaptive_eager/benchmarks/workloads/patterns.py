"""Programs shaped like public training and inference scripts (issue 16), small configs.

Each ``PATTERNS[name](steps)`` is a whole program in the image of a public one (random
init, a synthetic corpus written to a temporary folder, no downloads): it builds its data
and model, runs its loop and returns what the program would print or save, as Python
values, so that a run under the runtime can be compared with eager's exactly. They live
among the workloads because the runtime treats this folder as the program's own code
(``dispatch/source.py``): its reads end the warm-up and are the report's sync sites.

* ``lstm_lm``: pytorch/examples word_language_model, ``--model LSTM``: corpus tokenized
  from text (``torch.tensor`` per line, one ``torch.cat``), batchify, LSTM LM with dropout,
  ``clip_grad_norm_``, a manual SGD update through ``p.data``, ``loss.item()`` every batch,
  ``evaluate()`` under ``no_grad``, ``torch.save``/``torch.load`` and
  ``flatten_parameters()``.
* ``transformer_lm``: the same with ``--model Transformer`` (an ``nn.Transformer``
  encoder, its causal mask cached on the module).
* ``generate``: word_language_model's ``generate.py``: one word at a time,
  ``torch.multinomial``, ``input.fill_``, a dictionary lookup by a tensor index.
* ``nanogpt_train``: karpathy/nanoGPT ``train.py`` (tiny config): AdamW with decay and
  no-decay groups, gradient accumulation, a warm-up + cosine lr schedule,
  ``clip_grad_norm_``, ``estimate_loss()`` under ``no_grad``, ``loss.item()`` at a log
  interval.
* ``nanogpt_sample``: nanoGPT ``sample.py``: top-k, ``torch.multinomial``, the sequence
  growing by one token per step, cropped to the block size.
* ``lbfgs``: pytorch/examples time_sequence_prediction: two float64 ``LSTMCell`` s,
  ``torch.optim.LBFGS`` with a closure that prints the loss, a prediction under
  ``no_grad``.
* ``regression``: pytorch/examples regression: polynomial features, ``smooth_l1_loss``,
  ``output.item()`` every step, a manual update, stop when the loss is small.
* ``gan``: a 1-D GAN: two models, two Adam optimizers, alternating D and G steps.
* ``loss_print``: an MLP training loop printing ``loss.item()`` every step.

Example::

    >>> r = PATTERNS["regression"](5)
    >>> len(r["losses"])
    5
"""
from __future__ import annotations

import io
import math
from typing import Any, Callable, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F


from .patterns_wlm import generate, lstm_lm, transformer_lm  # noqa: E402


# -- nanoGPT ------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int = 65, block_size: int = 32, n_layer: int = 2, n_head: int = 4,
                 n_embd: int = 64, dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: Any) -> Any:
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None) -> torch.Tensor:
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def nanogpt_train(steps: int = 20) -> Dict[str, Any]:
    """nanoGPT ``train.py``, a tiny config: ``steps`` iterations."""
    torch.manual_seed(1337)
    block_size, batch_size, accum, eval_interval, eval_iters, log_interval = 32, 8, 2, 10, 2, 1
    learning_rate, min_lr, warmup_iters, lr_decay_iters = 1e-3, 1e-4, 5, max(steps, 6)
    data = torch.randint(0, 65, (4000,), generator=torch.Generator().manual_seed(0))
    train_data, val_data = data[:3600], data[3600:]

    def get_batch(split: str) -> Any:
        d = train_data if split == "train" else val_data
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([d[i:i + block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT(block_size=block_size)
    optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.99))

    @torch.no_grad()
    def estimate_loss() -> Dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

    X, Y = get_batch("train")
    log = []
    for iter_num in range(steps):
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if iter_num % eval_interval == 0:
            losses = estimate_loss()
            log.append(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        for micro_step in range(accum):
            _, loss = model(X, Y)
            loss = loss / accum
            X, Y = get_batch("train")
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % log_interval == 0:
            log.append(f"iter {iter_num}: loss {loss.item() * accum:.4f}")
    return {"log": log}


def nanogpt_sample(steps: int = 40) -> Dict[str, Any]:
    """nanoGPT ``sample.py``: ``steps`` new tokens (growing length, cropped to the block)."""
    torch.manual_seed(1337)
    model = GPT(block_size=32)
    model.eval()
    x = torch.tensor([[0]], dtype=torch.long)
    with torch.no_grad():
        y = model.generate(x, steps, temperature=0.8, top_k=10)
    return {"tokens": y[0].tolist()}


# -- time_sequence_prediction -------------------------------------------------------------
class Sequence(nn.Module):
    """time_sequence_prediction's model: two LSTMCells of ``hidden`` units and a Linear."""

    def __init__(self, hidden: int = 24) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        n = self.hidden
        h_t = torch.zeros(input.size(0), n, dtype=torch.double)
        c_t = torch.zeros(input.size(0), n, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), n, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), n, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def lbfgs(steps: int = 2) -> Dict[str, Any]:
    """time_sequence_prediction ``train.py``: ``steps`` LBFGS steps on sine waves."""
    np_rng = torch.Generator().manual_seed(2)
    T, L, N = 20, 40, 12
    x = torch.arange(L, dtype=torch.double).view(1, L) + torch.randint(-4 * T, 4 * T, (N, 1), generator=np_rng)
    data = torch.sin(x / 1.0 / T).double()
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    torch.manual_seed(0)
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    log = []
    for i in range(steps):
        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            log.append(f"loss: {loss.item()}")
            loss.backward()
            return loss
        optimizer.step(closure)
        with torch.no_grad():
            future = 5
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            log.append(f"test loss: {loss.item()}")
            y = pred.detach().numpy()
    return {"log": log, "y": y.tolist()}


# -- regression ---------------------------------------------------------------------------
def regression(steps: int = 200) -> Dict[str, Any]:
    """pytorch/examples ``regression/main.py``: at most ``steps`` steps."""
    torch.manual_seed(0)
    POLY_DEGREE = 4
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5

    def make_features(x: torch.Tensor) -> torch.Tensor:
        x = x.unsqueeze(1)
        return torch.cat([x ** i for i in range(1, POLY_DEGREE + 1)], 1)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.mm(W_target) + b_target.item()

    def get_batch(batch_size: int = 32) -> Any:
        random = torch.randn(batch_size)
        x = make_features(random)
        return x, f(x)

    fc = torch.nn.Linear(W_target.size(0), 1)
    losses = []
    for batch_idx in range(1, steps + 1):
        batch_x, batch_y = get_batch()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        losses.append(loss)
        if loss < 1e-3:
            break
    return {"losses": losses, "weight": fc.weight.view(-1).tolist(), "bias": fc.bias.item()}


# -- a 1-D GAN ----------------------------------------------------------------------------
def gan(steps: int = 40) -> Dict[str, Any]:
    """Two models, two Adam optimizers, alternating discriminator and generator steps."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    D = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    log = []
    for i in range(steps):
        real = torch.randn(64, 1) * 0.5 + 2.0
        z = torch.randn(64, 8)
        opt_d.zero_grad()
        fake = G(z)
        loss_d = criterion(D(real), ones) + criterion(D(fake.detach()), zeros)
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = criterion(D(fake), ones)
        loss_g.backward()
        opt_g.step()
        if i % 5 == 0:
            log.append(f"{i} D {loss_d.item():.5f} G {loss_g.item():.5f}")
    return {"log": log}


# -- a loop printing its loss every step ----------------------------------------------------
def loss_print(steps: int = 40) -> Dict[str, Any]:
    """An MLP training loop with ``print(loss.item())`` every step (printed to a buffer)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    out = io.StringIO()
    for i in range(steps):
        x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {i} loss {loss.item():.6f}", file=out)
    return {"out": out.getvalue()}


PATTERNS: Dict[str, Callable[[int], Dict[str, Any]]] = {
    "lstm_lm": lstm_lm,
    "transformer_lm": transformer_lm,
    "generate": generate,
    "nanogpt_train": nanogpt_train,
    "nanogpt_sample": nanogpt_sample,
    "lbfgs": lbfgs,
    "regression": regression,
    "gan": gan,
    "loss_print": loss_print,
}

# Steps per pattern for the benchmark (a few hundred ms eagerly on a 2-core CPU) and for
# the tests (small).
BENCH_STEPS = {"lstm_lm": 20, "transformer_lm": 20, "generate": 60, "nanogpt_train": 20,
               "nanogpt_sample": 60, "lbfgs": 3, "regression": 200, "gan": 60, "loss_print": 40}
TEST_STEPS = {"lstm_lm": 8, "transformer_lm": 8, "generate": 20, "nanogpt_train": 12,
              "nanogpt_sample": 40, "lbfgs": 2, "regression": 40, "gan": 12, "loss_print": 12}

__all__ = ["PATTERNS", "BENCH_STEPS", "TEST_STEPS", "GPT", "RNNModel", "TransformerModel",
           "Corpus", "corpus_dir"]
