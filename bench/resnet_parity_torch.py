#!/usr/bin/env python3
"""Eval parity of loom's ResNets with PyTorch from the same weights.

    meson compile -C build bench/resnet_parity
    /usr/bin/python3 bench/resnet_parity_torch.py --model resnet50 --stem imagenet

Runs build/bench/resnet_parity, which builds the model in loom, gives its BatchNorms
statistics and affine values away from 0/1, and saves the state_dict and an eval batch
with loom's logits and loss. Here the same weights load (strict: every key and shape) into
a torch.nn model written from torchvision's models/resnet.py (same module names; torchvision
itself is not needed), which evaluates the same images. Prints the relative difference of the
cross-entropy loss and the largest logit difference; exits 1 if the loss differs by more
than --tolerance (relative).

Not part of the build or the test suite (Debian's python3-torch is optional).
"""
import argparse
import subprocess
import sys

import torch
import torch.nn as nn

from parity import compare_eval  # the shared comparison and report


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, base_width=64):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """torchvision's V1.5: the stride is on conv2, the 3x3."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, base_width=64):
        super().__init__()
        width = int(planes * (base_width / 64.0))
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes, width_per_group=64, imagenet_stem=True):
        super().__init__()
        self.inplanes, self.base_width = 64, width_per_group
        if imagenet_stem:
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        else:  # loom's CIFAR stem (nn/resnet.h, Note [ResNet stems])
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if imagenet_stem else nn.Identity()
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, self.base_width)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, base_width=self.base_width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


MODELS = {
    "resnet18": (BasicBlock, [2, 2, 2, 2], 64),
    "resnet34": (BasicBlock, [3, 4, 6, 3], 64),
    "resnet50": (Bottleneck, [3, 4, 6, 3], 64),
    "resnet101": (Bottleneck, [3, 4, 23, 3], 64),
    "resnet152": (Bottleneck, [3, 8, 36, 3], 64),
    "wide_resnet50_2": (Bottleneck, [3, 4, 6, 3], 128),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    p.add_argument("--stem", default="imagenet", choices=["imagenet", "cifar"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--loom", default="build/bench/resnet_parity", help="loom's half (bench/resnet_parity.cpp)")
    p.add_argument("--out", default="/tmp/resnet_parity")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative loss difference that passes")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    subprocess.run([a.loom, "--model", a.model, "--stem", a.stem, "--batch", str(a.batch), "--size", str(a.size),
                    "--classes", str(a.classes), "--out", a.out], check=True)
    block, layers, width_per_group = MODELS[a.model]
    model = ResNet(block, layers, a.classes, width_per_group, imagenet_stem=a.stem == "imagenet")
    return compare_eval(model, a.out, f"{a.model} ({a.stem} stem), eval on {a.batch} images of {a.size}x{a.size}",
                        a.tolerance)


if __name__ == "__main__":
    sys.exit(main())
