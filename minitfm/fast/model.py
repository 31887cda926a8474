"""The book's model with the appendix installed, and `build_model`, which picks the code to run.

`build_model` makes the model a config's `model.code` names. `book`: the book's classes as
written. `fast`: the same classes, parameters and `state_dict`, with `FastLayerNorm` and
`FastMultiHeadAttention` in place of the book's layer norm and attention (the kernels of
`kernels.py`) and, in training on a CPU, the padding skipped (`packing.py`). Each piece is
tested equal to the book (tests/fast/test_fast.py).

Shapes: B batch, S source len, T target len, D d_model, H n_heads, K d_head, V vocab_size;
N the real tokens of a packed batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from minitfm.book.attention import EVERY_KEY, AttentionScope, KVCache, MultiHeadAttention
from minitfm.book.layers import LayerNorm
from minitfm.book.model import AttentionMaps, Seq2SeqTransformer
from minitfm.book.positions import Rotation
from minitfm.fast.kernels import LayerNormFunction, scaled_dot_product_attention
from minitfm.fast.packing import NO_PACKING, AttentionPacking, Packing, real_tokens


class FastLayerNorm(LayerNorm):
    """The book's LayerNorm, computed by `LayerNormFunction` (its backward written out)."""

    def forward(self, x: Tensor) -> Tensor:
        return LayerNormFunction.apply(x, self.weight, self.bias, self.eps)  # (..., D)


@dataclass(frozen=True)
class PackedScope(AttentionScope):
    """An AttentionScope whose inputs may hold only their real tokens, (N, D) (`packing.py`)."""

    packing: AttentionPacking = NO_PACKING


class FastMultiHeadAttention(MultiHeadAttention):
    """The book's MultiHeadAttention, computed by `AttentionFunction`, on packed rows too."""

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, scope: AttentionScope = EVERY_KEY,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor]:
        """As the book's; with a `PackedScope`, query and output (and key and value) may be
        packed rows (N, D), unpacked to the padded grid (B, T, D) for attention only."""
        positions = scope.positions
        packing = scope.packing if isinstance(scope, PackedScope) else NO_PACKING
        q = self.q_proj(query)  # (B, T_q, D), or (N_q, D) packed
        if packing.queries is not None:
            q = packing.queries.unpack(q)  # (B, T_q, D), zeros at the padding
        B, T_q, D = q.shape
        q = self.split_heads(q)  # (B, H, T_q, K)
        if positions.queries is not None:
            q = positions.queries.rotate(q)  # (B, H, T_q, K), RoPE
        k, v = self.project_rows(key, value, cache, positions.keys, packing.keys)
        keep = None  # the dropout scale Z / (1 - p) of each weight, drawn here
        if self.dropout.active:
            keep = self.dropout.scale(q.shape[:-1] + (k.size(-2),), q)  # (B, H, T_q, T_k)
        out, weights = scaled_dot_product_attention(q, k, v, scope.mask, positions.bias, keep)
        out = self.heads(out)  # (B, H, T_q, K): the hook point, as in the book
        out = out.transpose(1, 2).reshape(B, T_q, D)  # (B, T_q, D)
        if packing.queries is not None:
            out = packing.queries.pack(out)  # (N_q, D)
        return self.out_proj(out), weights

    def project_rows(
        self, key: Tensor, value: Tensor, cache: KVCache | None, rotation: Rotation | None,
        packing: Packing | None,
    ) -> tuple[Tensor, Tensor]:
        """The book's `project_kv`, from packed keys and values (N_k, D) when `packing` is set."""
        if packing is None:
            return self.project_kv(key, value, cache, rotation)  # (B, H, T_k, K) each
        k, v = packing.unpack(self.k_proj(key)), packing.unpack(self.v_proj(value))  # (B, T, D)
        return self.rotate_and_cache(self.split_heads(k), self.split_heads(v), cache, rotation)


KERNELS = {LayerNorm: FastLayerNorm, MultiHeadAttention: FastMultiHeadAttention}


def install_kernels(model: nn.Module) -> None:
    """Put the appendix's layer norm and attention in place of the book's, in every layer."""
    for name, module in list(model.named_modules()):
        kernel = KERNELS.get(type(module))
        if kernel is not None:
            model.set_submodule(name, adopt(module, kernel))


def adopt(module: nn.Module, kind: type[nn.Module]) -> nn.Module:
    """A `kind` (a subclass of module's class) holding module's own parameters, buffers,
    submodules and hooks, not copies: the same weights, another forward."""
    adopted = kind.__new__(kind)  # no __init__: nothing is allocated or drawn from the RNG
    adopted.__dict__.update(module.__dict__)
    return adopted


class FastTransformer(Seq2SeqTransformer):
    """The book's model with the kernels installed; in training on a CPU, packed rows.

    Packing needs to know where the real tokens are; on a GPU finding them would make the CPU
    wait for the GPU, and a GPU has cores to spare for the padding, so there it is not packed.
    """

    def __init__(self, model_config, vocab_size: int, pad_id: int):
        super().__init__(model_config, vocab_size, pad_id)  # the book's weights, as drawn there
        install_kernels(self)

    def forward(
        self, src: Tensor, tgt: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """As the book's `forward`; in training on a CPU the padding is skipped."""
        if not self.training or src.device.type != "cpu":
            return super().forward(src, tgt, return_attention)
        src_positions = tgt_positions = None
        if self.config.random_positions is not None:
            src_positions, tgt_positions = self.draw_positions(src, tgt)
        memory, src_mask, encoder_maps, rows = self.encode_rows(src, src_positions)
        logits, decoder_maps, cross_maps = self.decode_rows(tgt, memory, src_mask, tgt_positions,
                                                            src_positions, rows)
        if return_attention:
            return logits, AttentionMaps(encoder_maps, decoder_maps, cross_maps)
        return logits

    def embed_rows(self, tokens: Tensor, positions: Tensor | None,
                   packing: Packing | None) -> Tensor:
        """The book's `embed` (offset 0) of the real tokens only: (N, D) (None: (B, T, D))."""
        if packing is None:
            return self.embed(tokens, 0, positions)  # (B, T, D)
        positions = packing.columns if positions is None else packing.pack(positions)  # (N,)
        return self.embed(packing.pack(tokens), 0, positions)  # (N, D)

    def encode_rows(self, src: Tensor, positions: Tensor | None
                    ) -> tuple[Tensor, Tensor, list[Tensor], Packing | None]:
        """The book's `encode`, with the memory of the real tokens only, (N, D), and its Packing
        (None when no source is padded: (B, S, D))."""
        src_mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        in_attention = self.encoder_positions(src, positions)
        packing = real_tokens(src, self.pad_id)
        scope = PackedScope(src_mask, in_attention, AttentionPacking(packing, packing))
        x = self.embed_rows(src, positions, packing)  # (N, D) or (B, S, D)
        maps = []
        for layer in self.encoder_layers:
            x, weights = layer(x, scope)
            maps.append(weights)
        return self.encoder_norm(x), src_mask, maps, packing

    def decode_rows(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, tgt_positions: Tensor | None,
        src_positions: Tensor | None, memory_packing: Packing | None,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The book's `decode` without a cache (training), on packed rows: logits (B, T, V)."""
        T = tgt.size(1)
        self_mask = self.subsequent(0, T) if T > 1 else None  # (T, T)
        self_positions, cross_positions = self.decoder_positions(
            0, T, src_mask.size(-1), tgt.device, tgt_positions, src_positions)
        packing = real_tokens(tgt, self.pad_id)
        self_scope = PackedScope(self_mask, self_positions, AttentionPacking(packing, packing))
        cross_scope = PackedScope(src_mask, cross_positions,
                                  AttentionPacking(packing, memory_packing))
        x = self.embed_rows(tgt, tgt_positions, packing)  # (N, D) or (B, T, D)
        self_maps, cross_maps = [], []
        for layer in self.decoder_layers:
            x, self_weights, cross_weights = layer(x, memory, self_scope, cross_scope)
            self_maps.append(self_weights)
            cross_maps.append(cross_weights)
        logits = self.generator(self.decoder_norm(x))  # (N, V) or (B, T, V)
        if packing is not None:
            logits = packing.unpack(logits)  # (B, T, V), zeros at the padding (PAD targets)
        return logits, self_maps, cross_maps


CODES = {"book": Seq2SeqTransformer, "fast": FastTransformer}  # model.code -> the model's class


def build_model(cfg, task) -> Seq2SeqTransformer:
    """The model `cfg.model` describes, sized for the task's vocabulary, running the code
    `cfg.model.code` names (the one factory: every command builds its model here)."""
    return CODES[cfg.model.code](cfg.model, len(task.vocab), task.vocab.pad_id)
