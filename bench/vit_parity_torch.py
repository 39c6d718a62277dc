#!/usr/bin/env python3
"""Eval parity of loom's Vision Transformer with PyTorch from the same weights.

    meson compile -C build bench/vit_parity
    /usr/bin/python3 bench/vit_parity_torch.py --model vit_tiny

Runs build/bench/vit_parity, which builds the model in loom, moves its LayerNorms and biases
away from 1 and 0, and saves the state_dict (attention projections packed as PyTorch's
in_proj_weight) and an eval batch with loom's logits and loss. Here the same weights load
(strict: every key and shape) into a ViT built from torch.nn.TransformerEncoderLayer
(norm_first, GELU, batch_first: the blocks loom's nn/vision_transformer.h describes), which
evaluates the same images. Prints the relative difference of the cross-entropy loss and the
largest logit difference; exits 1 if the loss differs by more than --tolerance (relative).

Not part of the build or the test suite (Debian's python3-torch is optional).
"""
import argparse
import subprocess
import sys

import torch
import torch.nn as nn

from parity import compare_eval  # the shared comparison and report

CONFIGS = {  # hidden_dim, depth, heads, mlp_dim
    "vit_tiny": (192, 12, 3, 768),
    "vit_small": (384, 12, 6, 1536),
}


class VisionTransformer(nn.Module):
    """loom's nn::VisionTransformer in PyTorch, with the same module names."""

    def __init__(self, hidden_dim, depth, heads, mlp_dim, num_classes=10, image_size=32, patch_size=4, eps=1e-6):
        super().__init__()
        patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, hidden_dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + patches, hidden_dim))
        self.pos_drop = nn.Dropout(0.0)
        self.blocks = nn.Sequential(*[
            nn.TransformerEncoderLayer(hidden_dim, heads, mlp_dim, dropout=0.0, activation="gelu",
                                       layer_norm_eps=eps, batch_first=True, norm_first=True)
            for _ in range(depth)])
        self.norm = nn.LayerNorm(hidden_dim, eps=eps)
        self.head = nn.Linear(hidden_dim, num_classes)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(self.pos_drop(x)))
        return self.head(x[:, 0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="vit_tiny", choices=sorted(CONFIGS))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--loom", default="build/bench/vit_parity", help="loom's half (bench/vit_parity.cpp)")
    p.add_argument("--out", default="/tmp/vit_parity")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative loss difference that passes")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    subprocess.run([a.loom, "--model", a.model, "--batch", str(a.batch), "--out", a.out], check=True)
    return compare_eval(VisionTransformer(*CONFIGS[a.model]), a.out, f"{a.model}, eval on {a.batch} images of 32x32",
                        a.tolerance)


if __name__ == "__main__":
    sys.exit(main())
