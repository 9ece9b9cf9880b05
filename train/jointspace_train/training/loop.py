"""Train the joint space on cached FNE codes: one random caption per image per epoch, batches of 128 with the
rest of the batch as negatives, Adam, gradient clipping, the best dev rsum kept. With crop augmentation the
image side of each pair is one random crop of the ten (a regulariser, not in the paper). With `ema` the model
evaluated, kept and exported is an exponential moving average of the weights (not in the paper either); the
raw weights are evaluated beside it, so every epoch shows what the average gains.

The learning rate drops tenfold when dev rsum stops improving for `patience` epochs, and training stops at
the second plateau (or at `epochs`). The curriculum pipelines (PH, POE) run the sum loss to its plateau and
then continue from its best model with the max loss.
"""
from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..evaluation import retrieval
from ..text import tokenizer
from . import losses
from .model import ImageProjection, TextEncoder, l2norm


@dataclass
class Settings:
    loss: str = "MH"
    joint_dim: int = 1024
    word_dim: int = 300
    lr: float = 2e-4
    batch_size: int = 128
    grad_clip: float = 2.0
    margin: float | None = None        # 0.2 for cosine, 0.05 for order when not given
    temperature: float = 0.05          # of the CE loss (the hinge losses have a margin instead)
    use_abs: bool | None = None        # True for order embeddings when not given
    epochs: int = 200
    patience: int = 6
    max_tokens: int = 64
    min_count: int = 1
    seed: int = 0
    threads: int = 2
    image_input: str = "fne"           # "fne" (ternary codes) or "l2" (L2-normalised raw features, the baseline)
    bf16: bool = False                 # bfloat16 autocast for the training steps (about 2x on CPUs with AVX512-BF16)
    input_dropout: float = 0.0         # dropout on the image inputs while training (a regulariser; not in the paper)
    word_dropout: float = 0.0          # dropout on the word vectors while training (a regulariser; not in the paper)
    weight_decay: float = 0.0          # decoupled (AdamW) decay on the image projection only (a regulariser;
                                       # not in the paper)
    crop_augment: bool = False         # train on one random crop's input per image per epoch (dev, test: the
                                       # crops' mean)
    ema: float = 0.0                   # decay of an exponential moving average of the weights, per update (0: off)
    gru_layers: int = 1                # stacked recurrent layers in the caption encoder (the paper: one)
    rnn: str = "gru"                   # the caption encoder: "gru" (the paper's) or "lstm"
    word_init: str = "random"          # "random", or GloVe rows ("glove100", "glove50") for the words it knows
    freeze_words: int = 0              # epochs during which the word table is not updated (with word_init)
    hold_out: str = ""                 # comma-separated words (and their plurals) taken out of the training
                                       # and dev captions: the held-out-word experiment (docs/results.md)

    def resolved(self) -> Settings:
        s = copy.copy(self)
        similarity = losses.PIPELINES[s.loss][0]
        if s.margin is None:
            s.margin = 0.05 if similarity == "order" else 0.2
        if s.use_abs is None:
            s.use_abs = similarity == "order"
        return s


@dataclass
class Result:
    settings: dict
    best_epoch: int = 0
    dev: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    seconds: float = 0.0
    test: dict = field(default_factory=dict)
    command: str = ""
    features: dict = field(default_factory=dict)


class Encoded:
    """A split ready for the model: image inputs [N, D] float32 and tokenised captions (5 per image).

    `crops` ([N, n_crops, D], any dtype) are each crop's own inputs, for training with crop augmentation."""

    def __init__(self, image_inputs: np.ndarray, captions: list[list[str]], tok, max_tokens: int,
                 crops: np.ndarray | None = None):
        self.images = torch.from_numpy(np.ascontiguousarray(image_inputs, np.float32))
        if crops is not None and (crops.ndim != 3 or crops.shape[0] != len(captions)
                                  or crops.shape[2] != self.images.shape[1]):
            raise ValueError(f"crops {crops.shape} do not match {self.images.shape[0]} images of "
                             f"{self.images.shape[1]} features")
        self.crops = crops
        flat = [c for cs in captions for c in cs]
        self.owner = np.repeat(np.arange(len(captions)), [len(cs) for cs in captions])
        self.ids, self.lengths = tokenizer.encode_batch(tok, flat, max_tokens)
        self.per_image = [np.flatnonzero(self.owner == i) for i in range(len(captions))]


def device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def encode_texts(text: TextEncoder, ids: np.ndarray, lengths: np.ndarray, batch: int = 256) -> torch.Tensor:
    """Caption vectors (on the CPU), batched by similar length to waste little on padding."""
    order = np.argsort(lengths, kind="stable")
    out = torch.empty(len(lengths), text.joint_dim)
    dev = device_of(text)
    with torch.inference_mode():
        for k in range(0, len(order), batch):
            idx = order[k : k + batch]
            t = int(lengths[idx].max())
            # lengths stay on the CPU: pack_padded_sequence wants them there
            out[idx] = text(torch.from_numpy(ids[idx, :t]).to(dev), torch.from_numpy(lengths[idx])).cpu()
    return out


def image_vectors(proj: ImageProjection, split: Encoded) -> torch.Tensor:
    """The split's image vectors (on the CPU)."""
    with torch.inference_mode():
        return proj(split.images.to(device_of(proj))).cpu()


def sims(proj: ImageProjection, text: TextEncoder, split: Encoded, similarity: str,
         images: torch.Tensor | None = None) -> np.ndarray:
    """[N_img, N_cap] scores of the split; `images` are its image vectors if the caller already has them."""
    im = image_vectors(proj, split) if images is None else images
    with torch.inference_mode():
        cap = encode_texts(text, split.ids, split.lengths)
        if similarity == "order":
            dev = device_of(proj)
            if dev.type != "cpu":  # on a GPU the whole [rows, N_cap, D] difference fits: no need for blocks
                return losses.order_scores_rows(im, cap, dev).numpy()
            return losses.order_scores_blocked(im, cap).numpy()
        return losses.cosine_scores(im, cap).numpy()


def evaluate_split(proj, text, split: Encoded, similarity: str) -> dict:
    proj.eval(), text.eval()
    return retrieval.metrics(sims(proj, text, split, similarity), split.owner)


def ema_update(average: list[torch.Tensor], current: list[torch.Tensor], decay: float) -> None:
    """average <- decay * average + (1 - decay) * current, in place."""
    with torch.no_grad():
        for a, c in zip(average, current):
            a.lerp_(c, 1.0 - decay)


def cpu_bf16_is_fast() -> bool:
    """Whether this CPU runs bfloat16 matrix products in oneDNN (AVX-512 and up). Without it PyTorch falls back
    to a reference loop: on an AVX2-only EPYC a [128,1024]x[1024,3072] product took 1.3 s in bfloat16 against
    23 ms in float32."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else True


def table_dim(s: Settings) -> int:
    """The word table's width: GloVe's when the words start from it, else the words'."""
    if s.word_init == "random":
        return s.word_dim
    from ..text.glove import SOURCES

    if s.word_init not in SOURCES:
        raise ValueError(f"word_init must be 'random' or one of {sorted(SOURCES)}")
    return SOURCES[s.word_init].dim


def text_encoder(s: Settings, vocab_size: int, word_vectors: tuple[np.ndarray, np.ndarray] | None = None):
    """The caption encoder `s` describes; `word_vectors` (rows [V, table_dim], found [V]) replace the random
    rows of the words they have (the others keep theirs)."""
    text = TextEncoder(vocab_size, s.word_dim, s.joint_dim, s.use_abs, s.word_dropout, s.gru_layers, s.rnn,
                       table_dim(s))
    if word_vectors is not None:
        rows, found = word_vectors
        if rows.shape != tuple(text.embed.weight.shape):
            raise ValueError(f"word vectors {rows.shape} for a table of {tuple(text.embed.weight.shape)}")
        found = found.copy()
        found[0] = False  # the padding row (never read: padding follows a sentence's last token)
        with torch.no_grad():
            text.embed.weight[torch.from_numpy(found)] = torch.from_numpy(rows[found])
    return text


def train(settings: Settings, train_split: Encoded, dev_split: Encoded, vocab_size: int, log=print,
          init: dict | None = None, checkpoint=None, features: dict | None = None, device: str = "cpu",
          raw_eval: bool = True, word_vectors: tuple[np.ndarray, np.ndarray] | None = None):
    """`init` ({"proj": state, "text": state}) starts from a trained model; for a curriculum pipeline it is
    the best sum-loss model, so training goes straight to the max-loss phase. With `checkpoint` (a path),
    the whole training state is saved after every epoch and an interrupted run resumes from it. `features`
    (what the inputs were made from: crop mode, tap point, ...) is recorded, and a checkpoint made from other
    features is refused like one made with other settings. `device` ("cuda" on a GPU machine) is where the
    steps and the dev evaluations run; the models come back on the CPU either way. With `raw_eval` off, a run
    with a moving average does not also evaluate its raw weights (a sixth of a CPU epoch; it changes nothing
    the run keeps)."""
    s = settings.resolved()
    if s.crop_augment and train_split.crops is None:
        raise ValueError("crop augmentation needs the training split's per-crop inputs")
    if s.bf16 and torch.device(device).type == "cpu" and not cpu_bf16_is_fast():
        raise ValueError("this CPU has no fast bfloat16 matrix products (no AVX-512): bf16 autocast would run "
                         "about 58x slower than float32; train without --bf16 (a run started with it resumes "
                         "only on a CPU that has them, or on a GPU)")
    torch.manual_seed(s.seed)
    torch.set_num_threads(s.threads)
    rng = np.random.default_rng(s.seed)
    # A stream of its own, so that the captions drawn are the same with and without crop augmentation.
    crop_rng = np.random.default_rng([s.seed, 1])
    similarity, hardest, curriculum = losses.PIPELINES[s.loss]
    proj = ImageProjection(train_split.images.shape[1], s.joint_dim, s.use_abs).to(device)
    text = text_encoder(s, vocab_size, word_vectors).to(device)
    params = list(proj.parameters()) + list(text.parameters())
    # The averaged model: a shadow that training never reads, so the raw trajectory is the same with or without
    # it until a plateau restarts both from the best (averaged) model.
    avg = (copy.deepcopy(proj), copy.deepcopy(text)) if s.ema else None
    avg_params = [p for m in avg for p in m.parameters()] if avg else []

    def load(state):
        for m in ((proj, text),) + ((avg,) if avg else ()):
            m[0].load_state_dict(state[0]), m[1].load_state_dict(state[1])

    def optimizer():
        if s.weight_decay:
            # Only W: it is the part that over-fits 6,000 images (4.3 M weights); the text side has 30,000 captions.
            return torch.optim.AdamW([{"params": list(proj.parameters()), "weight_decay": s.weight_decay},
                                      {"params": list(text.parameters()), "weight_decay": 0.0}], lr=s.lr)
        return torch.optim.Adam(params, lr=s.lr)

    opt = optimizer()
    # Everything an interrupted run needs to go on exactly where it stopped.
    st = {"epoch": 0, "phase_hardest": hardest and not curriculum, "best_rsum": -1.0, "best": None,
          "since_best": 0, "decayed": False, "done": False, "seconds": 0.0,
          "result": asdict(Result(settings=asdict(s), features=dict(features or {})))}
    if init is not None:
        load((init["proj"], init["text"]))
        st["phase_hardest"] = hardest or curriculum
    if checkpoint is not None and Path(checkpoint).exists():
        # On the CPU first: the RNG states must stay there, and load_state_dict moves the rest.
        ck = torch.load(checkpoint, weights_only=False, map_location="cpu")
        proj.load_state_dict(ck["proj"]), text.load_state_dict(ck["text"]), opt.load_state_dict(ck["opt"])
        rng.bit_generator.state, st = ck["rng"], ck["state"]
        if "crop_rng" in ck:  # checkpoints from before crop augmentation lack it
            crop_rng.bit_generator.state = ck["crop_rng"]
        torch.set_rng_state(ck["torch_rng"])
        if ck.get("cuda_rng") is not None and torch.device(device).type == "cuda":
            torch.cuda.set_rng_state(ck["cuda_rng"], torch.device(device))
        log(f"resuming after epoch {st['epoch']} from {checkpoint}")
        # Only the epoch cap may change on resume (a run that hit its cap still improving goes on; the run is
        # then the same as one started with the higher cap). Anything else would be a different run.
        # A setting newer than the checkpoint was at its default there.
        was, now = {**asdict(Settings()), **st["result"]["settings"]}, asdict(s)
        changed = sorted(k for k in now if k != "epochs" and was[k] != now[k])
        # Checkpoints from before the features were recorded have none to compare.
        was_f, now_f = st["result"].get("features") or {}, features or {}
        changed += sorted(k for k in was_f.keys() & now_f.keys() if was_f[k] != now_f[k])
        if changed:
            raise ValueError(f"{checkpoint} was trained with other settings ({', '.join(changed)}); "
                             "use a new --run-dir")
        if avg:  # after the check: a run without the average has none to load
            avg[0].load_state_dict(ck["avg"][0]), avg[1].load_state_dict(ck["avg"][1])
        if was["epochs"] != s.epochs:
            log(f"epoch cap {was['epochs']} -> {s.epochs}")
            st["result"]["settings"]["epochs"] = s.epochs
    result = Result(**st["result"])
    t0 = time.time() - st["seconds"]
    n = train_split.images.shape[0]
    while not st["done"] and st["epoch"] < s.epochs:
        st["epoch"] += 1
        epoch = st["epoch"]
        proj.train(), text.train()
        # GloVe rows held still for the first epochs, so the randomly started rest learns around them first.
        text.embed.weight.requires_grad_(epoch > s.freeze_words)
        perm = rng.permutation(n)
        cap_idx = np.array([rng.choice(train_split.per_image[i]) for i in perm])
        total, t_epoch = 0.0, time.time()
        for k in range(0, n, s.batch_size):
            b_img, b_cap = perm[k : k + s.batch_size], cap_idx[k : k + s.batch_size]
            lengths = train_split.lengths[b_cap]
            ids = torch.from_numpy(train_split.ids[b_cap, : int(lengths.max())]).to(device)
            if s.crop_augment:
                pick = crop_rng.integers(train_split.crops.shape[1], size=len(b_img))
                x = torch.from_numpy(train_split.crops[b_img, pick].astype(np.float32))
            else:
                x = train_split.images[b_img]
            x = x.to(device)
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=s.bf16):
                if s.input_dropout:
                    x = torch.nn.functional.dropout(x, s.input_dropout)
                im = proj(x)
                cap = text(ids, torch.from_numpy(lengths))
            # The scores and the loss in float32: hinge differences are small next to bf16's resolution.
            s_ = losses.scores(im.float(), cap.float(), similarity)
            loss = losses.batch_loss(s.loss, s_, s.margin, s.temperature, st["phase_hardest"])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, s.grad_clip)
            opt.step()
            if avg:
                ema_update(avg_params, params, s.ema)
            total += loss.item()
        t_eval = time.time()
        kept = avg or (proj, text)
        dev = evaluate_split(*kept, dev_split, similarity)
        raw = {}
        if avg and raw_eval:
            raw = {f"raw_{k}": v for k, v in evaluate_split(proj, text, dev_split, similarity).items()}
        phase = "max" if st["phase_hardest"] else "sum"
        result.history.append({"epoch": epoch, "loss": round(total, 3), "phase": phase,
                               "lr": opt.param_groups[0]["lr"], **dev, **raw})
        log(f"epoch {epoch:3d} {phase} loss {total:9.2f} dev rsum {dev['rsum']:6.2f} "
            f"i2t R@1 {dev['i2t_r1']:5.1f} t2i R@1 {dev['t2i_r1']:5.1f}"
            + (f" (raw weights: rsum {raw['raw_rsum']:6.2f})" if raw else "")
            + f" ({time.time() - t0:.0f}s; epoch {t_eval - t_epoch:.0f}s + dev {time.time() - t_eval:.0f}s)")
        if dev["rsum"] > st["best_rsum"]:
            st["best_rsum"] = dev["rsum"]
            st["best"] = (copy.deepcopy(kept[0].state_dict()), copy.deepcopy(kept[1].state_dict()))
            result.best_epoch, result.dev = epoch, dev
            st["since_best"] = 0
        else:
            st["since_best"] += 1
        if st["since_best"] >= s.patience:
            # Plateau: the curriculum switches to the max loss from its best model; otherwise decay once, then stop.
            load(st["best"])
            st["since_best"] = 0
            if curriculum and not st["phase_hardest"]:
                st["phase_hardest"] = True
                opt = optimizer()
                log("curriculum: switching to the max-of-hinges loss from the best sum-loss model")
            elif not st["decayed"]:
                st["decayed"] = True
                for g in opt.param_groups:
                    g["lr"] *= 0.1
                log(f"plateau: learning rate -> {opt.param_groups[0]['lr']:g}")
            else:
                st["done"] = True
        st["seconds"] = time.time() - t0
        st["result"] = asdict(result)
        if checkpoint is not None:
            tmp = Path(str(checkpoint) + ".tmp")
            torch.save({"proj": proj.state_dict(), "text": text.state_dict(), "opt": opt.state_dict(),
                        "avg": avg and (avg[0].state_dict(), avg[1].state_dict()),
                        "rng": rng.bit_generator.state,
                        "crop_rng": crop_rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                        # dropout on a GPU draws from the GPU's generator
                        "cuda_rng": torch.cuda.get_rng_state(torch.device(device))
                        if torch.device(device).type == "cuda" else None, "state": st}, tmp)
            os.replace(tmp, checkpoint)
    proj.load_state_dict(st["best"][0]), text.load_state_dict(st["best"][1])
    proj, text = proj.cpu().eval(), text.cpu().eval()
    result.seconds = round(time.time() - t0, 1)
    return proj, text, result


def l2_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def save_result(result: Result, path) -> None:
    with open(path, "w") as f:
        json.dump(asdict(result), f, indent=1)


__all__ = ["Settings", "Encoded", "train", "evaluate_split", "l2_rows", "l2norm", "save_result"]
