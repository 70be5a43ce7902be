"""pytorch/examples word_language_model in small (issue 16): ``lstm_lm``, ``transformer_lm``
and ``generate`` of :mod:`.patterns` (a synthetic corpus written to a temporary folder,
random init, no downloads).

Example::

    >>> r = lstm_lm(2)
    >>> sorted(r)
    ['log', 'test', 'val']
"""

from __future__ import annotations

import atexit
import io
import math
import os
import random
import shutil
import tempfile
from typing import Any, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F


# -- word_language_model ----------------------------------------------------------------
_CORPUS: Dict[int, str] = {}


def corpus_dir(lines: int = 400, vocab: int = 300, seed: int = 0) -> str:
    """A folder with train/valid/test.txt of random words (written once per process)."""
    key = hash((lines, vocab, seed))
    if key not in _CORPUS:
        rng = random.Random(seed)
        words = [f"w{i}" for i in range(vocab)]
        d = tempfile.mkdtemp(prefix="ae-corpus-")
        atexit.register(shutil.rmtree, d, True)  # the process's own: gone at its exit
        for name, n in (("train", lines), ("valid", lines // 4), ("test", lines // 4)):
            with open(os.path.join(d, f"{name}.txt"), "w", encoding="utf8") as f:
                for _ in range(n):
                    f.write(" " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 20))) + " \n")
        _CORPUS[key] = d
    return _CORPUS[key]


class Dictionary:
    def __init__(self) -> None:
        self.word2idx: Dict[str, int] = {}
        self.idx2word: list = []

    def add_word(self, word: str) -> int:
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


class Corpus:
    def __init__(self, path: str) -> None:
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, "train.txt"))
        self.valid = self.tokenize(os.path.join(path, "valid.txt"))
        self.test = self.tokenize(os.path.join(path, "test.txt"))

    def tokenize(self, path: str) -> torch.Tensor:
        with open(path, "r", encoding="utf8") as f:
            for line in f:
                for word in line.split() + ["<eos>"]:
                    self.dictionary.add_word(word)
        with open(path, "r", encoding="utf8") as f:
            idss = []
            for line in f:
                ids = [self.dictionary.word2idx[w] for w in line.split() + ["<eos>"]]
                idss.append(torch.tensor(ids).type(torch.int64))
            return torch.cat(idss)


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.5):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input: torch.Tensor, hidden: Any) -> Any:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> Any:
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 500):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Transformer):
    def __init__(self, ntoken: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float = 0.5):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers)
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        nn.init.uniform_(self.input_emb.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, src: torch.Tensor, has_mask: bool = True) -> torch.Tensor:
        if has_mask:
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                self.src_mask = torch.log(torch.tril(torch.ones(len(src), len(src)))).to(src.device)
        else:
            self.src_mask = None
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        output = self.encoder(src, mask=self.src_mask)
        return F.log_softmax(self.decoder(output), dim=-1)


def word_language_model(steps: int = 20, model: str = "LSTM", epochs: int = 2) -> Dict[str, Any]:
    """``main.py`` of word_language_model: ``steps`` batches per epoch."""
    torch.manual_seed(1111)
    bptt, bs, ebs, lr, log_interval = 12, 8, 4, 20.0, 5
    corpus = Corpus(corpus_dir(lines=max(40, steps * bptt * bs // 10)))

    def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
        nbatch = data.size(0) // bsz
        return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()

    train_data = batchify(corpus.train, bs)[: steps * bptt + 1]
    val_data = batchify(corpus.valid, ebs)
    test_data = batchify(corpus.test, ebs)
    ntokens = len(corpus.dictionary)
    if model == "Transformer":
        net: nn.Module = TransformerModel(ntokens, 32, 2, 32, 2, 0.2)
    else:
        net = RNNModel(ntokens, 32, 32, 2, 0.2)
    criterion = nn.NLLLoss()
    out: Dict[str, Any] = {"log": [], "val": []}

    def repackage_hidden(h: Any) -> Any:
        return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)

    def get_batch(source: torch.Tensor, i: int) -> Any:
        seq_len = min(bptt, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)

    def evaluate(m: nn.Module, data_source: torch.Tensor) -> float:
        m.eval()
        total_loss = 0.0
        hidden = m.init_hidden(ebs) if model != "Transformer" else None
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, bptt):
                data, targets = get_batch(data_source, i)
                if model == "Transformer":
                    output = m(data).view(-1, ntokens)
                else:
                    output, hidden = m(data, hidden)
                    hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    for epoch in range(1, epochs + 1):
        net.train()
        total_loss = 0.0
        hidden = net.init_hidden(bs) if model != "Transformer" else None
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            data, targets = get_batch(train_data, i)
            net.zero_grad()
            if model == "Transformer":
                output = net(data).view(-1, ntokens)
            else:
                hidden = repackage_hidden(hidden)
                output, hidden = net(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.25)
            for p in net.parameters():
                p.data.add_(p.grad, alpha=-lr)
            total_loss += loss.item()
            if batch % log_interval == 0 and batch > 0:
                cur = total_loss / log_interval
                out["log"].append(f"| epoch {epoch:3d} | {batch:5d} batches | loss {cur:5.2f} | ppl {math.exp(cur):8.2f}")
                total_loss = 0
        out["val"].append(evaluate(net, val_data))
        buf = io.BytesIO()
        torch.save(net, buf)
    buf.seek(0)
    net = torch.load(buf, weights_only=False)
    if model == "LSTM":
        net.rnn.flatten_parameters()
    out["test"] = evaluate(net, test_data)
    out["model"] = net
    out["corpus"] = corpus
    return out


def lstm_lm(steps: int = 20) -> Dict[str, Any]:
    """word_language_model, ``--model LSTM``."""
    out = word_language_model(steps, "LSTM")
    return {k: out[k] for k in ("log", "val", "test")}


def transformer_lm(steps: int = 20) -> Dict[str, Any]:
    """word_language_model, ``--model Transformer``."""
    out = word_language_model(steps, "Transformer")
    return {k: out[k] for k in ("log", "val", "test")}


_TRAINED: Dict[str, Any] = {}


def generate(steps: int = 40) -> Dict[str, Any]:
    """word_language_model's ``generate.py``: ``steps`` words from a trained checkpoint."""
    if "lstm" not in _TRAINED:  # the checkpoint main.py saved: trained once per process
        out = word_language_model(4, "LSTM", epochs=1)
        buf = io.BytesIO()
        torch.save(out["model"], buf)
        _TRAINED["lstm"] = (buf.getvalue(), out["corpus"])
    blob, corpus = _TRAINED["lstm"]
    torch.manual_seed(1111)
    model = torch.load(io.BytesIO(blob), weights_only=False)
    model.eval()
    ntokens = len(corpus.dictionary)
    hidden = model.init_hidden(1)
    input = torch.randint(ntokens, (1, 1), dtype=torch.long)
    words = []
    with torch.no_grad():
        for i in range(steps):
            output, hidden = model(input, hidden)
            word_weights = output.squeeze().div(1.0).exp().cpu()
            word_idx = torch.multinomial(word_weights, 1)[0]
            input.fill_(word_idx)
            words.append(corpus.dictionary.idx2word[word_idx])
    return {"words": words}
