"""Swin Transformers Swin-T and Swin-B written against plain PyTorch.

As :mod:`.vit` does for the ViTs, this module rebuilds ``torchvision.models.swin_transformer``
(Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
arXiv:2103.14030; version 1, not V2) with nothing but ``torch``, with torchvision's module tree,
hence its ``state_dict`` keys and shapes (``features.<i>...``, ``norm``, ``head``; each block's
``norm1``, ``attn.{qkv, proj, relative_position_bias_table, relative_position_index}``,
``norm2``, ``mlp.0``/``mlp.3``), and its initialisation order: from one seed both build the same
weights and compute the same logits.

Unlike a ViT, a Swin model has no position embedding of a fixed length (its position bias is
relative, within 7 x 7 windows), so one model takes any image size: the feature maps are padded
to whole windows, and a window larger than the map is not shifted. Each transformer block is a
:class:`SwinTransformerBlock`, the unit ``dist=fsdp`` shards and activation checkpointing
recomputes (:data:`BLOCKS`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "BLOCKS",
    "PatchMerging",
    "ShiftedWindowAttention",
    "SwinTransformer",
    "SwinTransformerBlock",
    "swin_b",
    "swin_t",
]

NormLayer = Callable[[int], nn.Module]


class Permute(nn.Module):
    """``torch.permute`` as a module (torchvision's ``ops.misc.Permute``): no parameters."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: Tensor) -> Tensor:
        return torch.permute(x, self.dims)


class StochasticDepth(nn.Module):
    """Drops the residual branch of whole samples ("row" mode) with probability ``p`` in training,
    scaling the kept ones by 1 / (1 - p) (Huang et al., arXiv:1603.09382), as torchvision's
    ``ops.StochasticDepth``."""

    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"drop probability has to be between 0 and 1, but got {p}")
        if mode not in ("batch", "row"):
            raise ValueError(f"mode has to be either 'batch' or 'row', but got {mode}")
        self.p = p
        self.mode = mode

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return input
        survival_rate = 1.0 - self.p
        size = [input.shape[0]] + [1] * (input.ndim - 1) if self.mode == "row" else [1] * input.ndim
        noise = torch.empty(size, dtype=input.dtype, device=input.device).bernoulli_(survival_rate)
        if survival_rate > 0.0:
            noise.div_(survival_rate)
        return input * noise


def _patch_merging_pad(x: Tensor) -> Tensor:
    """(..., H, W, C) -> (..., H/2, W/2, 4C): each 2 x 2 neighbourhood's channels side by side."""
    h, w, _ = x.shape[-3:]
    x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
    x0 = x[..., 0::2, 0::2, :]
    x1 = x[..., 1::2, 0::2, :]
    x2 = x[..., 0::2, 1::2, :]
    x3 = x[..., 1::2, 1::2, :]
    return torch.cat([x0, x1, x2, x3], -1)


class PatchMerging(nn.Module):
    """Halves the feature map's side and doubles its channels, between stages."""

    def __init__(self, dim: int, norm_layer: NormLayer = nn.LayerNorm) -> None:
        super().__init__()
        self.dim = dim
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = norm_layer(4 * dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.reduction(self.norm(_patch_merging_pad(x)))


def shifted_window_attention(
    input: Tensor,
    qkv_weight: Tensor,
    proj_weight: Tensor,
    relative_position_bias: Tensor,
    window_size: list[int],
    num_heads: int,
    shift_size: list[int],
    attention_dropout: float = 0.0,
    dropout: float = 0.0,
    qkv_bias: Tensor | None = None,
    proj_bias: Tensor | None = None,
    training: bool = True,
) -> Tensor:
    """Multi-head self-attention within (shifted) windows, with a relative position bias, on a
    (B, H, W, C) map; torchvision's ``shifted_window_attention`` without V2's cosine attention."""
    b, h, w, c = input.shape
    # pad the map to whole windows
    pad_r = (window_size[1] - w % window_size[1]) % window_size[1]
    pad_b = (window_size[0] - h % window_size[0]) % window_size[0]
    x = F.pad(input, (0, 0, 0, pad_r, 0, pad_b))
    _, pad_h, pad_w, _ = x.shape

    # a window as large as the map is not shifted
    shift_size = shift_size.copy()
    if window_size[0] >= pad_h:
        shift_size[0] = 0
    if window_size[1] >= pad_w:
        shift_size[1] = 0
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))

    # partition into windows: (B * windows, tokens per window, C)
    num_windows = (pad_h // window_size[0]) * (pad_w // window_size[1])
    x = x.view(b, pad_h // window_size[0], window_size[0], pad_w // window_size[1], window_size[1], c)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(b * num_windows, window_size[0] * window_size[1], c)

    qkv = F.linear(x, qkv_weight, qkv_bias)
    qkv = qkv.reshape(x.size(0), x.size(1), 3, num_heads, c // num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = q * (c // num_heads) ** -0.5
    attn = q.matmul(k.transpose(-2, -1)) + relative_position_bias

    if sum(shift_size) > 0:
        # tokens that the roll brought together from apart may not attend to each other
        attn_mask = x.new_zeros((pad_h, pad_w))
        h_slices = ((0, -window_size[0]), (-window_size[0], -shift_size[0]), (-shift_size[0], None))
        w_slices = ((0, -window_size[1]), (-window_size[1], -shift_size[1]), (-shift_size[1], None))
        count = 0
        for hs in h_slices:
            for ws in w_slices:
                attn_mask[hs[0] : hs[1], ws[0] : ws[1]] = count
                count += 1
        attn_mask = attn_mask.view(pad_h // window_size[0], window_size[0], pad_w // window_size[1], window_size[1])
        attn_mask = attn_mask.permute(0, 2, 1, 3).reshape(num_windows, window_size[0] * window_size[1])
        attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
        attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        attn = attn.view(x.size(0) // num_windows, num_windows, num_heads, x.size(1), x.size(1))
        attn = attn + attn_mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, num_heads, x.size(1), x.size(1))

    attn = F.dropout(F.softmax(attn, dim=-1), p=attention_dropout, training=training)
    x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), c)
    x = F.dropout(F.linear(x, proj_weight, proj_bias), p=dropout, training=training)

    # reverse the windows, the roll and the padding
    x = x.view(b, pad_h // window_size[0], pad_w // window_size[1], window_size[0], window_size[1], c)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(b, pad_h, pad_w, c)
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(shift_size[0], shift_size[1]), dims=(1, 2))
    return x[:, :h, :w, :].contiguous()


class ShiftedWindowAttention(nn.Module):
    """The parameters of :func:`shifted_window_attention`: ``qkv``, ``proj`` and the relative
    position bias table, indexed by the ``relative_position_index`` buffer (in the state_dict)."""

    def __init__(
        self,
        dim: int,
        window_size: list[int],
        shift_size: list[int],
        num_heads: int,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attention_dropout: float = 0.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(window_size) != 2 or len(shift_size) != 2:
            raise ValueError("window_size and shift_size must be of length 2")
        self.window_size = window_size
        self.shift_size = shift_size
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.dropout = dropout
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

        # one learned bias per head and relative offset within a window: (2Wh - 1)(2Ww - 1) x heads
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads)
        )
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

        # each pair of tokens' row in that table
        coords = torch.stack(torch.meshgrid(torch.arange(window_size[0]), torch.arange(window_size[1]), indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += window_size[0] - 1
        relative_coords[:, :, 1] += window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * window_size[1] - 1
        self.relative_position_index: Tensor
        self.register_buffer("relative_position_index", relative_coords.sum(-1).flatten())

    def get_relative_position_bias(self) -> Tensor:
        n = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index].view(n, n, -1)
        return bias.permute(2, 0, 1).contiguous().unsqueeze(0)

    def forward(self, x: Tensor) -> Tensor:
        return shifted_window_attention(
            x,
            self.qkv.weight,
            self.proj.weight,
            self.get_relative_position_bias(),
            self.window_size,
            self.num_heads,
            shift_size=self.shift_size,
            attention_dropout=self.attention_dropout,
            dropout=self.dropout,
            qkv_bias=self.qkv.bias,
            proj_bias=self.proj.bias,
            training=self.training,
        )


class MLP(nn.Sequential):
    """Linear -> GELU -> Dropout -> Linear -> Dropout (torchvision's ``ops.MLP``: keys ``0.*``, ``3.*``)."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__(
            nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim), nn.Dropout(dropout)
        )


class SwinTransformerBlock(nn.Module):
    """x + attention(norm1(x)), then x + mlp(norm2(x)), each branch dropped by stochastic depth."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: list[int],
        shift_size: list[int],
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        stochastic_depth_prob: float = 0.0,
        norm_layer: NormLayer = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = ShiftedWindowAttention(
            dim, window_size, shift_size, num_heads, attention_dropout=attention_dropout, dropout=dropout
        )
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob, "row")
        self.norm2 = norm_layer(dim)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout)
        # (re-initialised by SwinTransformer; kept for the same random draws as torchvision)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.stochastic_depth(self.attn(self.norm1(x)))
        return x + self.stochastic_depth(self.mlp(self.norm2(x)))


class SwinTransformer(nn.Module):
    """Patches of ``patch_size`` embedded to ``embed_dim`` channels, four stages of blocks with
    patch merging between them, LayerNorm, global average pooling and a linear head; module tree
    identical to ``torchvision.models.SwinTransformer`` (its default block and patch merging)."""

    def __init__(
        self,
        patch_size: list[int],
        embed_dim: int,
        depths: list[int],
        num_heads: list[int],
        window_size: list[int],
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        stochastic_depth_prob: float = 0.1,
        num_classes: int = 1000,
        norm_layer: NormLayer | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes
        norm: NormLayer = norm_layer or partial(nn.LayerNorm, eps=1e-5)

        layers: list[nn.Module] = [
            nn.Sequential(
                nn.Conv2d(
                    3, embed_dim, kernel_size=(patch_size[0], patch_size[1]), stride=(patch_size[0], patch_size[1])
                ),
                Permute([0, 2, 3, 1]),  # B C H W -> B H W C
                norm(embed_dim),
            )
        ]
        total_blocks, block_id = sum(depths), 0
        for i_stage, depth in enumerate(depths):
            dim = embed_dim * 2**i_stage
            stage: list[nn.Module] = []
            for i_layer in range(depth):
                # stochastic depth grows linearly from 0 at the first block to the given rate at the last
                sd_prob = stochastic_depth_prob * float(block_id) / (total_blocks - 1)
                stage.append(
                    SwinTransformerBlock(
                        dim,
                        num_heads[i_stage],
                        window_size=window_size,
                        shift_size=[0 if i_layer % 2 == 0 else w // 2 for w in window_size],
                        mlp_ratio=mlp_ratio,
                        dropout=dropout,
                        attention_dropout=attention_dropout,
                        stochastic_depth_prob=sd_prob,
                        norm_layer=norm,
                    )
                )
                block_id += 1
            layers.append(nn.Sequential(*stage))
            if i_stage < len(depths) - 1:
                layers.append(PatchMerging(dim, norm))
        self.features = nn.Sequential(*layers)

        num_features = embed_dim * 2 ** (len(depths) - 1)
        self.norm = norm(num_features)
        self.permute = Permute([0, 3, 1, 2])  # B H W C -> B C H W
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        self.head = nn.Linear(num_features, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.features(x))
        return self.head(self.flatten(self.avgpool(self.permute(x))))


def swin_t(num_classes: int = 1000, **kwargs: Any) -> SwinTransformer:
    """Swin-T: 28,288,354 parameters at 1000 classes; stochastic depth 0.2."""
    kwargs.setdefault("stochastic_depth_prob", 0.2)
    return SwinTransformer([4, 4], 96, [2, 2, 6, 2], [3, 6, 12, 24], [7, 7], num_classes=num_classes, **kwargs)


def swin_b(num_classes: int = 1000, **kwargs: Any) -> SwinTransformer:
    """Swin-B: 87,768,224 parameters at 1000 classes; stochastic depth 0.5."""
    kwargs.setdefault("stochastic_depth_prob", 0.5)
    return SwinTransformer([4, 4], 128, [2, 2, 18, 2], [4, 8, 16, 32], [7, 7], num_classes=num_classes, **kwargs)


MODELS: dict[str, Callable[..., SwinTransformer]] = {"swin_t": swin_t, "swin_b": swin_b}

#: the blocks ``dist=fsdp`` shards on their own and activation checkpointing recomputes
BLOCKS = (SwinTransformerBlock,)
