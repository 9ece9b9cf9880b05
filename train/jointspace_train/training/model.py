"""The joint-space model: a GRU or LSTM caption encoder and a bias-free linear projection of the FNE code."""
from __future__ import annotations

import math

import torch
from torch import nn


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


RNNS = ("gru", "lstm")


class TextEncoder(nn.Module):
    """ids [N,T] + lengths [N] -> unit vectors [N, joint_dim] (|.| for order embeddings).

    A GRU (the paper's) or an LSTM (the course project's) over word vectors. With `table_dim` below
    `word_dim` the word table is narrower (GloVe's 50 or 100 dimensions) and a learned map `lift` widens each
    word to `word_dim`; `folded()` multiplies it into the table, so the exported graph has the usual shape."""

    def __init__(self, vocab_size: int, word_dim: int, joint_dim: int, use_abs: bool = False,
                 word_dropout: float = 0.0, layers: int = 1, rnn: str = "gru", table_dim: int | None = None):
        super().__init__()
        if rnn not in RNNS:
            raise ValueError(f"rnn must be one of {RNNS}")
        table_dim = table_dim or word_dim
        self.embed = nn.Embedding(vocab_size, table_dim, padding_idx=0)
        self.lift = nn.Linear(table_dim, word_dim, bias=False) if table_dim != word_dim else None
        # The GRU keeps its attribute name: state dicts and quantize-text read "gru".
        cell = nn.GRU if rnn == "gru" else nn.LSTM
        setattr(self, rnn, cell(word_dim, joint_dim, num_layers=layers, batch_first=True))
        self.kind = rnn
        self.use_abs = use_abs
        # Dropout on the word vectors while training (a regulariser; not in the paper). No parameters, so
        # the state dict and the exported graph are the same with or without it.
        self.word_dropout = nn.Dropout(word_dropout)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    @property
    def rnn(self) -> nn.Module:
        return getattr(self, self.kind)

    @property
    def joint_dim(self) -> int:
        return self.rnn.hidden_size

    def words(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.lift(x) if self.lift is not None else x

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.word_dropout(self.words(ids))
        if torch.onnx.is_in_onnx_export():
            # The state after each sentence's last real token. The RNN runs left to right, so right padding
            # never reaches it; this gather exports to ONNX (pack_padded_sequence does not).
            out, _ = self.rnn(x)
            last = (lengths - 1).clamp_min(0).view(-1, 1, 1).expand(-1, 1, out.shape[2])
            h = out.gather(1, last).squeeze(1)
        else:
            # Same state, but the RNN skips the padding: training batches are random, so padding to the
            # longest caption would about double the work on CPU.
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            state = self.rnn(packed)[1]
            h = (state[0] if self.kind == "lstm" else state)[-1]  # the top layer's (an LSTM's h, not c)
        h = l2norm(h)
        return h.abs() if self.use_abs else h

    def folded(self) -> TextEncoder:
        """The same function with `lift` multiplied into the word table (one Gather, no product, at export)."""
        if self.lift is None:
            return self
        rnn = self.rnn
        out = TextEncoder(self.embed.num_embeddings, self.lift.out_features, self.joint_dim, self.use_abs,
                          layers=rnn.num_layers, rnn=self.kind)
        with torch.no_grad():
            out.embed.weight.copy_(self.lift(self.embed.weight))
        out.rnn.load_state_dict(rnn.state_dict())
        return out.eval()


class ImageProjection(nn.Module):
    """FNE code [N, fne_dim] in {-1,0,1} -> unit vectors [N, joint_dim]."""

    def __init__(self, fne_dim: int, joint_dim: int, use_abs: bool = False):
        super().__init__()
        self.fc = nn.Linear(fne_dim, joint_dim, bias=False)
        self.use_abs = use_abs
        nn.init.xavier_uniform_(self.fc.weight)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        v = l2norm(self.fc(codes))
        return v.abs() if self.use_abs else v


class StackedText(nn.Module):
    """K caption encoders side by side: each member's unit vector over sqrt(K), so the whole is a unit vector
    whose dot product with a member-wise stack of image vectors is the mean of the members' cosines."""

    def __init__(self, members: list[TextEncoder]):
        super().__init__()
        if any(m.use_abs for m in members):
            raise ValueError("stacking is for cosine members (order embeddings do not add up this way)")
        self.members = nn.ModuleList(members)

    @property
    def joint_dim(self) -> int:
        return sum(m.joint_dim for m in self.members)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.cat([m(ids, lengths) for m in self.members], dim=1) / math.sqrt(len(self.members))


def stack(projs: list[ImageProjection], texts: list[TextEncoder]) -> tuple[ImageProjection, StackedText]:
    """One bundle-shaped model of K cosine models: W is the members' W one above the other (so the image
    vector is normalised as a whole, as the server does; it is the members' mean cosine only where their
    |W . code| agree) and the text vector is `StackedText`'s."""
    w = torch.cat([p.fc.weight.detach() for p in projs], dim=0)
    proj = ImageProjection(w.shape[1], w.shape[0])
    with torch.no_grad():
        proj.fc.weight.copy_(w)
    return proj.eval(), StackedText(texts).eval()
