"""The encoder-decoder transformer (Vaswani et al. 2017, §3) and greedy decoding with a KV cache.

Shapes: B batch, S source len, T target len (in greedy decoding: the decoded tokens),
D d_model, H n_heads, V vocab_size.

The model masks by itself: source padding (tokens == pad_id) in encoder self-attention and in
cross-attention, and future positions in decoder self-attention. Target padding needs no mask:
the loss ignores PAD targets and the causal mask keeps real positions from seeing later ones.

Positions are 0..S-1 in the source and 0..T-1 in the target (continuing from the cache when
decoding step by step); with `model.random_positions` set, `forward` in training mode draws
them instead (Ruoss et al. 2023), so that longer inputs at test time meet positions seen in
training. Schemes acting inside attention (RoPE, ALiBi) get the position indices through
`AttentionPositions`. What each attention attends over (mask, positions) travels as one
`AttentionScope`, built once per encode/decode call and shared by every layer.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitfm.book.attention import AttentionScope, KVCache, MultiHeadAttention
from minitfm.book.layers import Dropout, FeedForward, LayerNorm
from minitfm.book.positions import (
    NO_POSITIONS,
    AttentionPositions,
    make_positional,
    sample_positions,
)
from minitfm.config import ModelConfig
from minitfm.tasks.base import Vocab


def subsequent_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """Causal mask (size, size): position i may attend to positions j <= i (§3.2.3)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


@dataclass
class AttentionMaps:
    """Attention weights per layer: encoder (B,H,S,S), decoder (B,H,T,T), cross (B,H,T,S)."""

    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


@dataclass
class DecoderLayerCache:
    """The KV caches of one decoder layer: its self-attention grows, its cross-attention not."""

    self_attn: KVCache = field(default_factory=lambda: KVCache(grow=True))
    cross_attn: KVCache = field(default_factory=lambda: KVCache(grow=False))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each a residual sub-layer (Vaswani et al. 2017, §3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1 = LayerNorm(cfg.d_model)
        self.norm2 = LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)  # on each sub-layer's output, §5.4

    def forward(self, x: Tensor, scope: AttentionScope) -> tuple[Tensor, Tensor]:
        """x (B, S, D), scope.mask (B, 1, 1, S) -> x (B, S, D), weights (B, H, S, S)."""
        if self.norm_first:  # pre-LN: x + Sublayer(LN(x)) (Xiong et al. 2020)
            h = self.norm1(x)
            attn, weights = self.self_attn(h, h, h, scope)
            x = x + self.dropout(attn)
            x = x + self.dropout(self.feed_forward(self.norm2(x)))
        else:  # post-LN, as in the paper: LN(x + Sublayer(x))
            attn, weights = self.self_attn(x, x, x, scope)
            x = self.norm1(x + self.dropout(attn))
            x = self.norm2(x + self.dropout(self.feed_forward(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the memory, feed-forward (Vaswani §3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1 = LayerNorm(cfg.d_model)
        self.norm2 = LayerNorm(cfg.d_model)
        self.norm3 = LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self, x: Tensor, memory: Tensor, self_scope: AttentionScope, cross_scope: AttentionScope,
        cache: DecoderLayerCache | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D), memory (B, S, D) -> x (B, T, D), self (B,H,T,T'), cross (B,H,T,S).

        `self_scope` holds the causal mask, `cross_scope` the source padding mask.
        """
        self_cache = cache.self_attn if cache is not None else None
        cross_cache = cache.cross_attn if cache is not None else None
        if self.norm_first:
            h = self.norm1(x)
            attn, self_weights = self.self_attn(h, h, h, self_scope, self_cache)
            x = x + self.dropout(attn)
            h = self.norm2(x)
            attn, cross_weights = self.cross_attn(h, memory, memory, cross_scope, cross_cache)
            x = x + self.dropout(attn)
            x = x + self.dropout(self.feed_forward(self.norm3(x)))
        else:
            attn, self_weights = self.self_attn(x, x, x, self_scope, self_cache)
            x = self.norm1(x + self.dropout(attn))
            attn, cross_weights = self.cross_attn(x, memory, memory, cross_scope, cross_cache)
            x = self.norm2(x + self.dropout(attn))
            x = self.norm3(x + self.dropout(self.feed_forward(x)))
        return x, self_weights, cross_weights


class Seq2SeqTransformer(nn.Module):
    """The encoder-decoder transformer of Vaswani et al. 2017, §3, pre-LN or post-LN."""

    def __init__(self, model_config: ModelConfig, vocab_size: int, pad_id: int):
        super().__init__()
        cfg = model_config
        self.config = cfg
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.embed_scale = cfg.d_model**0.5  # §3.4: embeddings are multiplied by sqrt(d_model)
        self.embedding = nn.Embedding(vocab_size, cfg.d_model)  # shared by encoder and decoder
        # Sinusoids are tabulated up to the larger of max_len and random_positions (learned ones
        # stop at max_len: the config keeps random_positions within it).
        table_len = max(cfg.max_len, cfg.random_positions or 0)
        self.positional = make_positional(cfg.positional, table_len, cfg.d_model, cfg.n_heads)
        self.embed_dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        self.encoder_norm = LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.decoder_norm = LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, vocab_size, bias=False)  # to logits
        # Built once and sliced per call; a non-persistent buffer follows .to(device).
        self.register_buffer("causal_mask", subsequent_mask(cfg.max_len), persistent=False)
        self._init_weights()
        if cfg.tie_embeddings:  # §3.4: one matrix for input embedding and output projection
            self.generator.weight = self.embedding.weight

    def _init_weights(self) -> None:
        """Xavier-uniform projections, zero biases, N(0, 1/D) token embeddings."""
        # Xavier keeps each projection's output variance near its input's (Glorot & Bengio
        # 2010), as nn.Transformer and the Annotated Transformer do. Token embeddings get std
        # D^-0.5 (as fairseq): times sqrt(D) they enter at unit scale, like the positions, and
        # the tied output projection of a layer-normed state starts with logits of std ~1.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.embedding.weight, std=self.config.d_model**-0.5)

    def embed(self, tokens: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Tokens (B, T) -> scaled embeddings plus positions offset.. or `positions`: (B, T, D)."""
        x = self.embedding(tokens) * self.embed_scale  # (B, T, D)
        return self.embed_dropout(self.positional(x, offset, positions))

    def encode(self, src: Tensor,
               positions: Tensor | None = None) -> tuple[Tensor, Tensor, list[Tensor]]:
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S), encoder maps [(B, H, S, S)].

        `positions` (B, S) replaces 0..S-1 (randomized positions, drawn by `forward`).
        """
        src_mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S), True = real token
        scope = AttentionScope(src_mask, self.encoder_positions(src, positions))
        x = self.embed(src, positions=positions)  # (B, S, D)
        maps = []
        for layer in self.encoder_layers:
            x, weights = layer(x, scope)
            maps.append(weights)
        return self.encoder_norm(x), src_mask, maps  # memory (B, S, D)

    def encoder_positions(self, src: Tensor, positions: Tensor | None) -> AttentionPositions:
        """What RoPE or ALiBi do in encoder self-attention: the same for every layer."""
        if not self.positional.in_attention:
            return NO_POSITIONS
        pos = self.indices(positions, src.size(1), 0, src.device)  # (S,) or (B, S)
        return self.positional.attention(pos, pos)

    @staticmethod
    def indices(positions: Tensor | None, length: int, offset: int, device) -> Tensor:
        """`positions` when given, else offset..offset+length-1: (length,) or (B, length)."""
        if positions is not None:
            return positions
        return torch.arange(offset, offset + length, device=device)  # (length,)

    def decoder_positions(
        self, offset: int, T: int, S: int, device, tgt_positions: Tensor | None,
        src_positions: Tensor | None,
    ) -> tuple[AttentionPositions, AttentionPositions]:
        """What RoPE or ALiBi do in decoder self-attention and in cross-attention."""
        if not self.positional.in_attention:
            return NO_POSITIONS, NO_POSITIONS
        queries = self.indices(tgt_positions, T, offset, device)  # (T,) or (B, T)
        # Self-attention keys: the cached positions 0..offset-1, then this call's.
        keys = queries if offset == 0 else torch.arange(offset + T, device=device)
        sources = self.indices(src_positions, S, 0, device)  # (S,) or (B, S)
        return (self.positional.attention(queries, keys),
                self.positional.attention(queries, sources, cross=True))

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: list[DecoderLayerCache] | None = None,
        tgt_positions: Tensor | None = None,
        src_positions: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """tgt (B, T) -> logits (B, T, V), decoder maps [(B,H,T,T)], cross maps [(B,H,T,S)].

        With a `cache` (from `new_cache`), `tgt` holds only the tokens after those already
        cached; their positions and causal mask continue from there. `tgt_positions` (B, T) and
        `src_positions` (B, S) replace 0..T-1 and 0..S-1 (randomized positions, no cache).
        """
        offset = cache[0].self_attn.length if cache is not None else 0
        T = tgt.size(1)
        # (T, offset + T), rows offset..offset+T-1; a single new token (a decoding step) may
        # see every position so far, so it needs no mask.
        self_mask = self.subsequent(offset, T) if T > 1 else None
        self_positions, cross_positions = self.decoder_positions(
            offset, T, src_mask.size(-1), tgt.device, tgt_positions, src_positions)
        self_scope = AttentionScope(self_mask, self_positions)
        cross_scope = AttentionScope(src_mask, cross_positions)
        x = self.embed(tgt, offset, tgt_positions)  # (B, T, D)
        self_maps, cross_maps = [], []
        for i, layer in enumerate(self.decoder_layers):
            layer_cache = cache[i] if cache is not None else None
            x, self_weights, cross_weights = layer(x, memory, self_scope, cross_scope,
                                                   layer_cache)
            self_maps.append(self_weights)
            cross_maps.append(cross_weights)
        return self.generator(self.decoder_norm(x)), self_maps, cross_maps  # (B, T, V), ...

    def subsequent(self, offset: int, length: int) -> Tensor:
        """Rows offset..offset+length-1 of the causal mask: (length, offset + length)."""
        end = offset + length
        if end > self.causal_mask.size(0):  # longer than max_len (sinusoidal): grow the cache,
            # doubling, so that decoding n tokens past it rebuilds it log(n) times, not n times
            size = max(end, 2 * self.causal_mask.size(0))
            self.causal_mask = subsequent_mask(size, self.causal_mask.device)
        return self.causal_mask[offset:end, :end]

    def new_cache(self) -> list[DecoderLayerCache]:
        """Empty KV caches, one per decoder layer, for incremental decoding."""
        return [DecoderLayerCache() for _ in self.decoder_layers]

    def forward(
        self, src: Tensor, tgt: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """src (B, S), tgt (B, T) -> logits (B, T, V), and AttentionMaps if asked."""
        src_positions = tgt_positions = None
        if self.training and self.config.random_positions is not None:
            src_positions, tgt_positions = self.draw_positions(src, tgt)
        memory, src_mask, encoder_maps = self.encode(src, src_positions)
        logits, decoder_maps, cross_maps = self.decode(tgt, memory, src_mask, None, tgt_positions,
                                                       src_positions)
        if return_attention:
            return logits, AttentionMaps(encoder_maps, decoder_maps, cross_maps)
        return logits

    def draw_positions(self, src: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor]:
        """Randomized positions (Ruoss et al. 2023): source (B, S) and target (B, T) positions.

        Each row draws one sorted random subset of [0, model.random_positions), as many as its
        longer side has tokens; source and target both start from its beginning, so source
        token i and target input i share a position, as 0..n-1 do at test time.
        """
        lengths = torch.maximum((src != self.pad_id).sum(1), (tgt != self.pad_id).sum(1))  # (B,)
        S, T = src.size(1), tgt.size(1)
        positions = sample_positions(lengths, max(S, T), self.config.random_positions)  # (B, W)
        return positions[:, :S], positions[:, :T]


def sequence_loss(logits: Tensor, targets: Tensor, pad_id: int, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """Teacher-forced cross-entropy per target token (EOS included), PAD ignored.

    logits (B, T, V) in any float type; the loss is taken in float32.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),  # (B*T, V), (B*T,)
                           ignore_index=pad_id, label_smoothing=label_smoothing,
                           reduction=reduction)


@contextmanager
def eval_mode(model: nn.Module):
    """Dropout off for the block (decoding and measuring are deterministic), then the mode
    the model had before, even if the block raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqTransformer,
    src: Tensor,
    vocab: Vocab,
    max_len: int,
    use_cache: bool = True,
    encoded: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Batched greedy decoding from BOS: tokens (B, T <= max_len), EOS kept, PAD after it.

    Each step feeds the tokens so far (with `use_cache`, only the newest: the KV caches hold
    the rest) and appends the most likely next token. `encoded` is `model.encode(src)`'s
    memory and source mask when the caller has them already.
    """
    with eval_mode(model):  # dropout off: decoding is deterministic
        if encoded is None:  # the source is encoded once, for every step
            memory, src_mask, _ = model.encode(src)
        else:
            memory, src_mask = encoded
        B = src.size(0)
        tokens = torch.full((B, 1), vocab.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        cache = model.new_cache() if use_cache else None
        for _ in range(max_len):
            step_input = tokens[:, -1:] if use_cache else tokens  # (B, 1) or (B, t)
            logits, _, _ = model.decode(step_input, memory, src_mask, cache)
            next_token = logits[:, -1].argmax(dim=-1)  # (B,)
            next_token = next_token.masked_fill(done, model.pad_id)  # finished rows: PAD
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
            done |= next_token == vocab.eos_id
            if bool(done.all()):
                break
        return tokens[:, 1:]  # drop the leading BOS
