"""Vision Transformers ViT-B/16, ViT-L/16 and ViT-H/14 written against plain PyTorch.

As :mod:`.models` does for the ResNets, and for the same reason (torchvision's wheels do not
load against the CPU build of torch here), this module rebuilds ``torchvision.models.
vision_transformer`` (Dosovitskiy et al., arXiv:2010.11929) with nothing but ``torch``. Its
module tree -- attribute names, registration order, ``nn.MultiheadAttention`` for the attention,
an ``nn.Sequential`` MLP whose linear layers are ``mlp.0`` and ``mlp.3`` -- mirrors torchvision's,
so ``state_dict()`` keys and shapes are identical and checkpoints interchange both ways:

    conv_proj.{weight,bias}, class_token, encoder.pos_embedding,
    encoder.layers.encoder_layer_<i>.{ln_1, self_attention.{in_proj_*, out_proj.*}, ln_2, mlp.0, mlp.3},
    encoder.ln, heads.head

Built in the same order with the same initialisations, a model here draws the same random
numbers as torchvision's: from one seed both compute the same logits (the tests hold both to it).

The position embedding has one entry per patch (plus the class token), so a model is built for
one ``image_size``: 224 in the ImageNet recipe, as small as one patch in a test (32 px at patch
16 is 2 x 2 patches). ``image_size`` must be a multiple of the patch size. Each transformer block
is an :class:`EncoderBlock`, the unit that ``dist=fsdp`` shards and activation checkpointing
recomputes (:data:`BLOCKS`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["BLOCKS", "EncoderBlock", "VisionTransformer", "vit_b_16", "vit_h_14", "vit_l_16"]


class MLPBlock(nn.Sequential):
    """Linear -> GELU -> Dropout -> Linear -> Dropout: torchvision's ``MLPBlock`` (an
    ``ops.MLP``), so the linear layers' keys are ``0.*`` and ``3.*``."""

    # torchvision's version 2: version 1 named the layers linear_1 / linear_2 (renamed on load)
    _version = 2

    def __init__(self, in_dim: int, mlp_dim: int, dropout: float) -> None:
        super().__init__(
            nn.Linear(in_dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, in_dim),
            nn.Dropout(dropout),
        )
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # a checkpoint of torchvision < 0.14 (MLPBlock version 1) loads as torchvision loads it
        version = local_metadata.get("version")
        if version is None or version < 2:
            for i in range(2):
                for kind in ("weight", "bias"):
                    old_key, new_key = f"{prefix}linear_{i + 1}.{kind}", f"{prefix}{3 * i}.{kind}"
                    if old_key in state_dict:
                        state_dict[new_key] = state_dict.pop(old_key)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def _layer_norm(dim: int) -> nn.Module:
    # eps=1e-6, as torchvision (and the original JAX ViT); torch's default is 1e-5
    return nn.LayerNorm(dim, eps=1e-6)


NormLayer = Callable[[int], nn.Module]


class EncoderBlock(nn.Module):
    """One pre-norm transformer block: x + attention(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(
        self,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        dropout: float,
        attention_dropout: float,
        norm_layer: NormLayer = _layer_norm,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = norm_layer(hidden_dim)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, dropout=attention_dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = norm_layer(hidden_dim)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, input: Tensor) -> Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """The position embedding, the blocks (``layers.encoder_layer_<i>``) and the final LayerNorm."""

    def __init__(
        self,
        seq_length: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        dropout: float,
        attention_dropout: float,
        norm_layer: NormLayer = _layer_norm,
    ) -> None:
        super().__init__()
        # batch first, as the attention (batch_first=True); std 0.02 as BERT
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(num_layers):
            layers[f"encoder_layer_{i}"] = EncoderBlock(
                num_heads, hidden_dim, mlp_dim, dropout, attention_dropout, norm_layer
            )
        self.layers = nn.Sequential(layers)
        self.ln = norm_layer(hidden_dim)

    def forward(self, input: Tensor) -> Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        return self.ln(self.layers(self.dropout(input + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """ViT (arXiv:2010.11929): non-overlapping patches projected by a strided conv, a class token,
    a transformer encoder, and a linear head on the class token's output. Module tree, and with
    it ``state_dict`` keys and shapes, identical to ``torchvision.models.VisionTransformer``
    (without its optional convolutional stem)."""

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        num_classes: int = 1000,
        representation_size: int | None = None,
        norm_layer: NormLayer = _layer_norm,
    ) -> None:
        super().__init__()
        if image_size < 1 or patch_size < 1 or image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a positive multiple of patch_size {patch_size}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.mlp_dim = mlp_dim
        self.attention_dropout = attention_dropout
        self.dropout = dropout
        self.num_classes = num_classes
        self.representation_size = representation_size
        self.norm_layer = norm_layer

        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.seq_length = (image_size // patch_size) ** 2 + 1  # the patches and the class token
        self.encoder = Encoder(
            self.seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout, norm_layer
        )

        heads: OrderedDict[str, nn.Module] = OrderedDict()
        if representation_size is None:
            heads["head"] = nn.Linear(hidden_dim, num_classes)
        else:
            heads["pre_logits"] = nn.Linear(hidden_dim, representation_size)
            heads["act"] = nn.Tanh()
            heads["head"] = nn.Linear(representation_size, num_classes)
        self.heads = nn.Sequential(heads)

        # torchvision's init, in its order (the same random draws from the same seed)
        fan_in = self.conv_proj.in_channels * self.conv_proj.kernel_size[0] * self.conv_proj.kernel_size[1]
        nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
        assert self.conv_proj.bias is not None
        nn.init.zeros_(self.conv_proj.bias)
        if representation_size is not None:
            pre_logits = self.heads.pre_logits
            assert isinstance(pre_logits, nn.Linear)
            nn.init.trunc_normal_(pre_logits.weight, std=math.sqrt(1 / pre_logits.in_features))
            nn.init.zeros_(pre_logits.bias)
        # a zero head: every class starts equally likely
        head = self.heads.head
        assert isinstance(head, nn.Linear)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)

    def _process_input(self, x: Tensor) -> Tensor:
        """(n, 3, h, w) images -> (n, patches, hidden_dim) patch embeddings."""
        n, _, h, w = x.shape
        p = self.patch_size
        torch._assert(h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!")
        torch._assert(w == self.image_size, f"Wrong image width! Expected {self.image_size} but got {w}!")
        x = self.conv_proj(x)  # (n, hidden_dim, h / p, w / p)
        return x.reshape(n, self.hidden_dim, (h // p) * (w // p)).permute(0, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self._process_input(x)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.encoder(x)
        return self.heads(x[:, 0])  # the class token's output


def vit_b_16(image_size: int = 224, num_classes: int = 1000, **kwargs: Any) -> VisionTransformer:
    """ViT-B/16: 12 blocks of width 768, 12 heads; 86,567,656 parameters at 224 px, 1000 classes."""
    return VisionTransformer(image_size, 16, 12, 12, 768, 3072, num_classes=num_classes, **kwargs)


def vit_l_16(image_size: int = 224, num_classes: int = 1000, **kwargs: Any) -> VisionTransformer:
    """ViT-L/16: 24 blocks of width 1024, 16 heads; 304,326,632 parameters at 224 px, 1000 classes."""
    return VisionTransformer(image_size, 16, 24, 16, 1024, 4096, num_classes=num_classes, **kwargs)


def vit_h_14(image_size: int = 224, num_classes: int = 1000, **kwargs: Any) -> VisionTransformer:
    """ViT-H/14: 32 blocks of width 1280, 16 heads; 632,045,800 parameters at 224 px, 1000 classes."""
    return VisionTransformer(image_size, 14, 32, 16, 1280, 5120, num_classes=num_classes, **kwargs)


MODELS: dict[str, Callable[..., VisionTransformer]] = {"vit_b_16": vit_b_16, "vit_l_16": vit_l_16, "vit_h_14": vit_h_14}

#: the blocks ``dist=fsdp`` shards on their own and activation checkpointing recomputes
BLOCKS = (EncoderBlock,)
