"""Plain reference trainers for `minitfm bench --solve`: the same model size and recipe, trained
the way a user of torch or of x-transformers would write it.

- `torch`: `ReferenceTransformer` (torch.nn.Transformer) and torch.optim.AdamW (fused);
- `x-transformers`: `x_transformers.XTransformer` at the same size (optional: the `bench` extra).

The recipe is minitfm's, read from the config: the same training stream (`task.sample` from
`torch.Generator().manual_seed(seed)`), `torch.manual_seed(seed)` before the model, AdamW with
betas (0.9, 0.98) and weight decay on matrices only, minitfm's lr schedule (`lr_factor`), the
gradient clip, cross-entropy ignoring PAD, and a run's evaluation schedule (`run.schedule`): a
full greedy evaluation every train.eval_every steps, quick checks on a fifth of the held-out set
every train.check_every steps once an evaluation reached two thirds of the target, a stop at the
target.

A plain trainer writes nothing: no TensorBoard, no checkpoints, no attention pictures.
minitfm's own run writes all of those, and must still win. `run` trains one and reports
trainer, seed, steps_to_target (the step of the full evaluation that reached
train.target_exact_match, or null), steps, exact_match (of the final evaluation); the bench
runs it in a process of its own, `python -m minitfm.app.reference` (`app/reference.py`, which
prints the report as one JSON line).

Shapes: B batch, S source length, T target length, D d_model, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from minitfm.book.loop import due, lr_factor, reached_target
from minitfm.book.metrics import EVAL_BATCH_SIZE, length_chunks, strip_eos
from minitfm.book.model import eval_mode, sequence_loss
from minitfm.book.positions import sinusoids
from minitfm.config import Config, ModelConfig, TrainConfig, load_config
from minitfm.errors import ConfigError, MinitfmError
from minitfm.run.schedule import check_due, check_pairs
from minitfm.tasks import make_task
from minitfm.tasks.base import Batch, Task, eval_set, make_batch

TRAINERS = ("torch", "x-transformers")
XT_MISSING = "x-transformers is not installed (pip install x-transformers)"


class ReferenceTransformer(nn.Module):
    """The same model from `torch.nn.Transformer`: embeddings, positions, output layer alike."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int):
        super().__init__()
        self.pad_id, self.d_model = pad_id, cfg.d_model
        self.embedding = nn.Embedding(vocab_size, cfg.d_model)
        self.register_buffer("positions", sinusoids(cfg.max_len, cfg.d_model), persistent=False)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout,
                                           batch_first=True, norm_first=cfg.norm_first)
        encoder = nn.TransformerEncoder(layer, cfg.n_encoder_layers, nn.LayerNorm(cfg.d_model),
                                        enable_nested_tensor=False)  # a training-only yardstick
        self.transformer = nn.Transformer(
            cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
            cfg.dropout, custom_encoder=encoder, batch_first=True, norm_first=cfg.norm_first)
        self.out = nn.Linear(cfg.d_model, vocab_size)
        # Token embeddings N(0, 1/D), as minitfm's and fairseq's: nn.Embedding's N(0, 1) times
        # sqrt(D), tied to the output, starts at a loss of ~63 and the default config ends at
        # 5% exact match instead of solving (nn.Transformer's own layers are Xavier already).
        nn.init.normal_(self.embedding.weight, std=cfg.d_model**-0.5)
        if cfg.tie_embeddings:
            self.out.weight = self.embedding.weight

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens) * math.sqrt(self.d_model)  # (B, S, D) or (B, T, D)
        return x + self.positions[: tokens.size(1)]

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        pad = src == self.pad_id  # (B, S) True = padding, torch's convention
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=causal,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad,
                             tgt_is_causal=True)  # (B, T, D)
        return self.out(h)  # (B, T, V)


def torch_adamw(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """torch.optim.AdamW as minitfm's: decay on matrices only, betas (0.9, 0.98), fused."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), fused=True)


class TorchReference:
    """nn.Transformer trained and decoded as a plain torch script does it."""

    def __init__(self, cfg: Config, task: Task):
        self.vocab = task.vocab
        self.model = ReferenceTransformer(cfg.model, len(task.vocab), task.vocab.pad_id)
        self.label_smoothing = cfg.train.label_smoothing

    def loss(self, batch: Batch) -> Tensor:
        """Teacher-forced cross-entropy per target token, PAD ignored."""
        logits = self.model(batch.src, batch.tgt_in)  # (B, T, V)
        return sequence_loss(logits, batch.tgt_out, self.vocab.pad_id, self.label_smoothing)

    @torch.no_grad()
    def decode(self, src: Tensor, cap: int) -> Tensor:
        """Greedy tokens (B, <= cap) from BOS. nn.Transformer has no KV cache: the source is
        encoded once, and the decoder re-runs on the whole prefix at every step, as a plain
        nn.Transformer trainer does; a chunk stops when every row has emitted EOS."""
        model, vocab = self.model, self.vocab
        with eval_mode(model):
            pad = src == vocab.pad_id  # (B, S)
            memory = model.transformer.encoder(model.embed(src), src_key_padding_mask=pad)
            tokens = torch.full((src.size(0), 1), vocab.bos_id, device=src.device)  # (B, 1)
            done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # (B,)
            for _ in range(cap):
                causal = nn.Transformer.generate_square_subsequent_mask(
                    tokens.size(1), device=src.device)  # (t, t)
                h = model.transformer.decoder(model.embed(tokens), memory, tgt_mask=causal,
                                              memory_key_padding_mask=pad,
                                              tgt_is_causal=True)  # (B, t, D)
                next_token = model.out(h[:, -1]).argmax(dim=-1)  # (B,)
                tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
                done |= next_token == vocab.eos_id
                if bool(done.all()):
                    break
        return tokens[:, 1:]


def import_xtransformers():
    """The x_transformers module, or None when it is not installed."""
    try:
        import x_transformers
    except ImportError:
        return None
    return x_transformers


class XTransformersReference:
    """x_transformers.XTransformer at minitfm's size, trained and decoded as its README does.

    Its defaults otherwise: learned absolute positions (AbsolutePositionalEmbedding, scaled by
    D**-0.5), pre-LN LayerNorms without bias, GELU feed-forward, no bias in attention. Masks:
    True = attend (`mask` = source non-PAD); its AutoregressiveWrapper shifts `tgt` itself and
    ignores `ignore_index` (PAD) in the loss.
    """

    def __init__(self, cfg: Config, task: Task):
        xt = import_xtransformers()
        if xt is None:
            raise MinitfmError(XT_MISSING)
        if cfg.train.label_smoothing:
            raise ConfigError(f"train.label_smoothing ({cfg.train.label_smoothing}): "
                              f"x-transformers' loss has none; use 0 with this reference")
        m, self.vocab = cfg.model, task.vocab
        sides = {f"{side}_{key}": value for side in ("enc", "dec") for key, value in {
            "num_tokens": len(task.vocab), "max_seq_len": m.max_len, "heads": m.n_heads,
            "attn_dim_head": m.d_model // m.n_heads,  # its default is 64 whatever the width
            "ff_mult": m.d_ff // m.d_model, "pre_norm": m.norm_first,
            "attn_dropout": m.dropout, "ff_dropout": m.dropout}.items()}
        self.model = xt.XTransformer(
            dim=m.d_model, enc_depth=m.n_encoder_layers, dec_depth=m.n_decoder_layers,
            tie_token_emb=True, pad_value=task.vocab.pad_id, ignore_index=task.vocab.pad_id,
            **sides)
        if m.tie_embeddings:  # tie_token_emb shares the two embeddings; ours is the output too
            self.model.decoder.net.to_logits.weight = self.model.encoder.token_emb.emb.weight

    def loss(self, batch: Batch) -> Tensor:
        """Its own loss on BOS + target + EOS (it shifts): cross-entropy, PAD ignored."""
        tgt = torch.cat([batch.tgt_in[:, :1], batch.tgt_out], dim=1)  # (B, T + 1)
        return self.model(batch.src, tgt, mask=batch.src != self.vocab.pad_id)

    @torch.no_grad()
    def decode(self, src: Tensor, cap: int) -> Tensor:
        """Its `generate`, greedy (temperature 0) with its KV cache; PAD after EOS."""
        start = torch.full((src.size(0), 1), self.vocab.bos_id, device=src.device)  # (B, 1)
        with eval_mode(self.model):  # its generate leaves the encoder in training mode
            return self.model.generate(src, start, cap, mask=src != self.vocab.pad_id,
                                       temperature=0.0, eos_token=self.vocab.eos_id,
                                       cache_kv=True)  # (B, <= cap)


REFERENCES = {"torch": TorchReference, "x-transformers": XTransformersReference}


def predict(ref, task: Task, sources: list[list[int]], device) -> list[list[int]]:
    """Greedy decoding of each source (up to EOS), in chunks sorted by length as minitfm's
    `metrics.predict`; the target is never looked at."""
    out = [[] for _ in sources]
    for chunk in length_chunks([len(s) for s in sources], EVAL_BATCH_SIZE):
        src = make_batch([(sources[i], []) for i in chunk], task.vocab).src.to(device)  # (B, S)
        caps = [task.max_target_len(len(sources[i])) + 1 for i in chunk]  # + EOS, each its own
        for i, cap, row in zip(chunk, caps, ref.decode(src, max(caps)).tolist()):
            out[i] = strip_eos(row[:cap], task.vocab.eos_id)  # as minitfm's decode_chunk
    return out


def exact_match(ref, task: Task, pairs: list, device) -> float:
    """The fraction of pairs whose greedy decoding equals the target."""
    predictions = predict(ref, task, [src for src, _ in pairs], device)
    return sum(p == t for p, (_, t) in zip(predictions, pairs, strict=True)) / max(len(pairs), 1)


def train_step(ref, optimizer: torch.optim.Optimizer, batch: Batch, lr: float,
               cfg: TrainConfig, device: torch.device) -> None:
    """One AdamW step at `lr` on `batch` (bfloat16 autocast on CUDA, as minitfm's)."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = ref.loss(batch)
    optimizer.zero_grad()
    loss.backward()
    for group in optimizer.param_groups:
        group["lr"] = lr
    if cfg.grad_clip is not None:
        nn.utils.clip_grad_norm_(ref.model.parameters(), cfg.grad_clip)
    optimizer.step()


def train_reference(ref, cfg: Config, task: Task, device: torch.device) -> dict:
    """Train `ref` with minitfm's recipe and evaluation schedule (see the module docstring)."""
    train_cfg = cfg.train
    optimizer = torch_adamw(ref.model, train_cfg)
    data_rng = torch.Generator().manual_seed(cfg.seed)
    pairs = eval_set(task, train_cfg.eval_samples, cfg.task.eval_seed)
    best, last, solved, step = -1.0, None, None, 0
    while step < train_cfg.steps and solved is None:
        batch = make_batch(task.sample(train_cfg.batch_size, data_rng), task.vocab)
        lr = train_cfg.lr * lr_factor(step, train_cfg)
        train_step(ref, optimizer, batch.to(device), lr, train_cfg, device)
        step += 1
        evaluate_now = due(step, train_cfg.eval_every)
        if not evaluate_now and check_due(step, train_cfg, best):  # calls, never decides
            evaluate_now = reached_target(exact_match(ref, task, check_pairs(pairs), device),
                                          train_cfg)
        if evaluate_now:
            last = (step, exact_match(ref, task, pairs, device))
            best = max(best, last[1])
            solved = step if reached_target(last[1], train_cfg) else None
    if last is None or last[0] != step:  # the last step had no evaluation
        last = (step, exact_match(ref, task, pairs, device))
        solved = step if reached_target(last[1], train_cfg) else None
    return {"steps_to_target": solved, "steps": step, "exact_match": last[1]}


def run(trainer: str, overrides: list[str]) -> dict:
    """Build the reference `trainer` on the config with `overrides`, train it, and report."""
    from minitfm.run.devices import pick_device

    if trainer not in REFERENCES:
        raise ConfigError(f"trainer ({trainer!r}) must be one of {', '.join(TRAINERS)}")
    cfg = load_config(None, overrides)
    if isinstance(cfg.threads, int):
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    task = make_task(cfg.task)
    torch.manual_seed(cfg.seed)
    ref = REFERENCES[trainer](cfg, task)
    ref.model.to(device).train()
    return {"trainer": trainer, "seed": cfg.seed, **train_reference(ref, cfg, task, device)}
