"""PyTorch definitions of the zoo models, so PyTorch can be benchmarked as a peer engine.

``smelt bench`` runs each zoo model in PyTorch through its own ``torch.nn``
definition, not through an ONNX importer: that is how PyTorch users actually
run these networks, so the timing is PyTorch's real eager-mode latency.  For
the comparison to be fair and checkable, each definition here computes exactly
what the zoo's ONNX graph computes, with the same weights:

* The CNNs are written like torchvision's (``Conv2d``/``BatchNorm2d``/``ReLU``
  with ``inplace=True``, ``AdaptiveAvgPool2d`` heads ...) and their module
  paths are chosen so that ``state_dict()`` keys *are* the ONNX initializer
  names (``layer1.0.bn1.running_mean``).  Where the zoo differs from
  torchvision, the zoo wins: MobileNetV2 uses the zoo's flat
  ``expand``/``dw``/``project`` names, Inception-v3 BatchNorms use eps=1e-5
  (torchvision: 1e-3) and VGG-16 has no ``AdaptiveAvgPool2d((7, 7))``.
* The RNNs use ``torch.nn.LSTM`` / ``torch.nn.GRU`` (one multi-layer module,
  as a PyTorch user would write it); their weights are converted from the
  ONNX W/R/B layout and gate order, since the layouts cannot share names.

:func:`torch_model_for` builds a definition and loads an ONNX zoo model's
weights into it strictly.  The returned module's ``forward`` takes the ONNX
graph inputs positionally and returns a tuple in graph-output order, so a
harness can compare with onnxruntime output by output.

This module imports torch at import time (the ``nn.Module`` classes need it);
nothing else in smelt imports this module eagerly, so smelt itself does not
need torch.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import Tensor, nn

from . import RnnSpec, _normalize, list_models, parse_rnn_name

__all__ = ["torch_model_for", "has_torch_definition", "TORCH_CNN_MODELS", "RnnModel"]


# --------------------------------------------------------------------- ResNet
def _downsample(inplanes: int, outplanes: int, stride: int) -> nn.Sequential | None:
    """1x1 projection shortcut (keys ``downsample.0`` / ``downsample.1``), if needed."""
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(
        nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes)
    )


class BasicBlock(nn.Module):
    """ResNet-18/34 block: two 3x3 convs plus the shortcut."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _downsample(inplanes, planes, stride)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """ResNet-50 v1.5 block: 1x1 -> 3x3 (carries the stride) -> 1x1 expanding 4x."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, planes * 4, stride)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet with the zoo's 1000-class head; input [N, 3, 224, 224]."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for stage, (planes, blocks) in enumerate(zip([64, 128, 256, 512], layers, strict=True)):
            stage_blocks = []
            for i in range(blocks):
                stride = 2 if stage > 0 and i == 0 else 1
                stage_blocks.append(block(inplanes, planes, stride))
                inplanes = planes * block.expansion
            setattr(self, f"layer{stage + 1}", nn.Sequential(*stage_blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, 1000)

    def forward(self, x: Tensor) -> tuple[Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return (self.fc(x),)


def resnet18() -> ResNet:
    """ResNet-18 (BasicBlock x [2, 2, 2, 2])."""
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> ResNet:
    """ResNet-50 v1.5 (Bottleneck x [3, 4, 6, 3])."""
    return ResNet(Bottleneck, [3, 4, 6, 3])


# ------------------------------------------------------------------------ VGG
class VGG16(nn.Module):
    """VGG-16 (configuration D).

    No ``AdaptiveAvgPool2d((7, 7))`` between features and classifier: the zoo
    omits it (an identity at 224x224), so this model, like the ONNX one,
    only accepts 224x224 inputs.
    """

    _CFG: tuple[int | str, ...] = (
        *(64, 64, "M"),
        *(128, 128, "M"),
        *(256, 256, 256, "M"),
        *(512, 512, 512, "M"),
        *(512, 512, 512, "M"),
    )

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in self._CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, int(v), 3, 1, 1), nn.ReLU(inplace=True)]
                cin = int(v)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, 1000),
        )

    def forward(self, x: Tensor) -> tuple[Tensor]:
        x = torch.flatten(self.features(x), 1)
        return (self.classifier(x),)


# ---------------------------------------------------------------- MobileNetV2
# The zoo names MobileNetV2's layers ``features.<i>.{conv,expand,dw,project}``
# with sibling ``<layer>_bn`` BatchNorms, not torchvision's nested
# ``features.<i>.conv.<j>.<k>``, so these modules carry those flat attributes.
class _StemConv(nn.Module):
    """Conv + BN + ReLU6 (``features.0`` and ``features.18``: ``conv``, ``conv_bn``)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, bias=False)
        self.conv_bn = nn.BatchNorm2d(cout)
        # ReLU6 == the zoo's Clip(0, 6) (both are hardtanh(0, 6)).
        self.conv_relu6 = nn.ReLU6(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_relu6(self.conv_bn(self.conv(x)))


class InvertedResidual(nn.Module):
    """Expand 1x1 (unless t == 1) -> depthwise 3x3 -> linear project 1x1 (+ skip)."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = cin * expand_ratio
        self.has_expand = expand_ratio != 1
        if self.has_expand:
            self.expand = nn.Conv2d(cin, hidden, 1, bias=False)
            self.expand_bn = nn.BatchNorm2d(hidden)
            self.expand_relu6 = nn.ReLU6(inplace=True)
        self.dw = nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False)
        self.dw_bn = nn.BatchNorm2d(hidden)
        self.dw_relu6 = nn.ReLU6(inplace=True)
        self.project = nn.Conv2d(hidden, cout, 1, bias=False)
        self.project_bn = nn.BatchNorm2d(cout)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = x
        if self.has_expand:
            out = self.expand_relu6(self.expand_bn(self.expand(out)))
        out = self.dw_relu6(self.dw_bn(self.dw(out)))
        out = self.project_bn(self.project(out))
        # Same operand order as the zoo's Add(x, out); fp addition commutes anyway.
        return x + out if self.use_res_connect else out


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0); input [N, 3, 224, 224]."""

    # (expand ratio t, channels c, repeats n, first stride s), as in the paper.
    _SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [_StemConv(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in self._SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_StemConv(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

    def forward(self, x: Tensor) -> tuple[Tensor]:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return (self.classifier(x),)


# ----------------------------------------------------------------- SqueezeNet
class Fire(nn.Module):
    """SqueezeNet Fire module: 1x1 squeeze, then concat(1x1 expand, 3x3 expand)."""

    def __init__(self, cin: int, squeeze: int, e1: int, e3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        s = self.squeeze_activation(self.squeeze(x))
        a = self.expand1x1_activation(self.expand1x1(s))
        c = self.expand3x3_activation(self.expand3x3(s))
        return torch.cat([a, c], 1)


class SqueezeNet11(nn.Module):
    """SqueezeNet 1.1 with ceil-mode max pools and the conv classifier."""

    def __init__(self) -> None:
        super().__init__()

        def pool() -> nn.MaxPool2d:
            # ceil_mode as in torchvision and the zoo graph; at 224x224 every window
            # fits (111 -> 55 -> 27 -> 13), so it only matters at other sizes.
            return nn.MaxPool2d(3, 2, ceil_mode=True)

        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2),
            nn.ReLU(inplace=True),
            pool(),
            Fire(64, 16, 64, 64),
            Fire(128, 16, 64, 64),
            pool(),
            Fire(128, 32, 128, 128),
            Fire(256, 32, 128, 128),
            pool(),
            Fire(256, 48, 192, 192),
            Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256),
            Fire(512, 64, 256, 256),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(0.5),
            nn.Conv2d(512, 1000, 1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d((1, 1)),
        )

    def forward(self, x: Tensor) -> tuple[Tensor]:
        return (torch.flatten(self.classifier(self.features(x)), 1),)


# ------------------------------------------------------------------- DenseNet
class _DenseLayer(nn.Module):
    """Pre-activation BN-ReLU-Conv1x1-BN-ReLU-Conv3x3; returns only the new features."""

    def __init__(self, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(y)))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers: int, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        for i in range(num_layers):
            self[f"denselayer{i + 1}"] = _DenseLayer(cin + i * growth, growth, bn_size)

    def forward(self, x: Tensor) -> Tensor:
        # The zoo appends each layer's output after the running feature map
        # (Concat([x, y])), giving torchvision's [init, l1, l2, ...] channel order.
        for layer in self.values():
            x = torch.cat([x, layer(x)], 1)
        return x


class _Transition(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2)


class DenseNet121(nn.Module):
    """DenseNet-121 (growth 32, blocks [6, 12, 24, 16], bn_size 4)."""

    def __init__(self, growth: int = 32, bn_size: int = 4) -> None:
        super().__init__()
        parts: list[tuple[str, nn.Module]] = [
            ("conv0", nn.Conv2d(3, 64, 7, 2, 3, bias=False)),
            ("norm0", nn.BatchNorm2d(64)),
            ("relu0", nn.ReLU(inplace=True)),
            ("pool0", nn.MaxPool2d(3, 2, 1)),
        ]
        c = 64
        for i, n_layers in enumerate([6, 12, 24, 16]):
            parts.append((f"denseblock{i + 1}", _DenseBlock(n_layers, c, growth, bn_size)))
            c += n_layers * growth
            if i != 3:
                parts.append((f"transition{i + 1}", _Transition(c, c // 2)))
                c //= 2
        parts.append(("norm5", nn.BatchNorm2d(c)))
        self.features = nn.Sequential(OrderedDict(parts))
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(c, 1000)

    def forward(self, x: Tensor) -> tuple[Tensor]:
        x = self.relu(self.features(x))
        return (self.classifier(torch.flatten(self.avgpool(x), 1)),)


# --------------------------------------------------------------- Inception-v3
_Size = int | tuple[int, int]


class BasicConv2d(nn.Module):
    """Conv (no bias) + BatchNorm + ReLU.

    eps=1e-5, not torchvision's 1e-3: the zoo's BatchNormalization nodes use
    the ONNX default, and the weights only reproduce the zoo's outputs with it.
    """

    def __init__(
        self, cin: int, cout: int, kernel: _Size, stride: int = 1, padding: _Size = 0
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-5)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.bn(self.conv(x)))


def _avg3(x: Tensor) -> Tensor:
    # 3x3/s1/p1 average counting the padding, the zoo's count_include_pad=1.
    return nn.functional.avg_pool2d(x, 3, 1, 1, count_include_pad=True)


class InceptionA(nn.Module):
    """35x35 block: 1x1, 5x5, double-3x3 and avg-pool branches."""

    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x: Tensor) -> Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(_avg3(x))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    """35 -> 17 reduction: strided 3x3, strided double-3x3, max-pool."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = nn.functional.max_pool2d(x, 3, 2)
        return torch.cat([b3, bd, bp], 1)


class InceptionC(nn.Module):
    """17x17 block with factorized 1x7/7x1 convs."""

    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: Tensor) -> Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        bd = self.branch7x7dbl_3(self.branch7x7dbl_2(bd))
        bd = self.branch7x7dbl_5(self.branch7x7dbl_4(bd))
        bp = self.branch_pool(_avg3(x))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    """17 -> 8 reduction: strided 3x3, 7x7x3 tower, max-pool."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_2(self.branch7x7x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(b7))
        bp = nn.functional.max_pool2d(x, 3, 2)
        return torch.cat([b3, b7, bp], 1)


class InceptionE(nn.Module):
    """8x8 block whose 3x3 branches split into parallel 1x3/3x1 convs."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: Tensor) -> Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(_avg3(x))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionV3(nn.Module):
    """Inception-v3 at 299x299, no auxiliary head, no ``transform_input`` (as the zoo)."""

    def __init__(self) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, 2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.maxpool2 = nn.MaxPool2d(3, 2)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x: Tensor) -> tuple[Tensor]:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = self.maxpool1(x)
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6a(x)
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(x))))
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.dropout(self.avgpool(x))
        return (self.fc(torch.flatten(x, 1)),)


TORCH_CNN_MODELS: dict[str, Callable[[], nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": VGG16,
    "mobilenet_v2": MobileNetV2,
    "squeezenet1_1": SqueezeNet11,
    "densenet121": DenseNet121,
    "inception_v3": InceptionV3,
}


# ----------------------------------------------------------------------- RNNs
class RnnModel(nn.Module):
    """The zoo's ``lstm_model``: a (stacked, bidirectional) ``nn.LSTM``/``nn.GRU``.

    ``forward(x)`` takes x [T, B, E] (seq-first, ONNX layout 0) and returns
    (y [T, B, D*H], y_h [D, B, H]) for the last layer.  A single multi-layer
    torch module computes exactly what the zoo's chain of per-layer ONNX ops
    plus Transpose/Reshape glue computes: torch also feeds each layer the
    direction-major concatenation [forward H | backward H] of the previous one.

    With ``initial_states`` (a zoo model built with ``initial_states=True``)
    ``forward`` also takes the per-layer states in graph-input order:
    ``h0_0, c0_0, h0_1, c0_1, ...`` (LSTM) or ``h0_0, h0_1, ...`` (GRU), each
    [D, B, H]; otherwise the initial state is zero, as in ONNX.
    """

    def __init__(
        self,
        cell: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        initial_states: bool = False,
    ) -> None:
        super().__init__()
        if cell not in ("lstm", "gru"):
            raise ValueError(f"cell must be 'lstm' or 'gru', got {cell!r}")
        rnn_cls = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_cls(input_size, hidden_size, num_layers, bidirectional=bidirectional)
        self.cell = cell
        self.num_directions = 2 if bidirectional else 1
        self.initial_states = initial_states

    def forward(self, x: Tensor, *states: Tensor) -> tuple[Tensor, Tensor]:
        hx: Tensor | tuple[Tensor, Tensor] | None = None
        if self.initial_states:
            per_layer = 2 if self.cell == "lstm" else 1
            if len(states) != per_layer * self.rnn.num_layers:
                raise TypeError(
                    f"expected {per_layer * self.rnn.num_layers} initial-state tensors, "
                    f"got {len(states)}"
                )
            # Per-layer [D, B, H] stacked layer-major is torch's [L*D, B, H] layout.
            h0 = torch.cat(states[::per_layer])
            hx = (h0, torch.cat(states[1::per_layer])) if self.cell == "lstm" else h0
        elif states:
            raise TypeError("this model has no initial-state inputs")
        y, h_n = self.rnn(x, hx)
        if isinstance(h_n, tuple):  # LSTM: (h_n, c_n)
            h_n = h_n[0]
        # h_n is [L*D, B, H]; the zoo's y_h is only the last layer's [D, B, H].
        return y, h_n[-self.num_directions :]


# ONNX gate blocks in torch's order.  LSTM: ONNX i,o,f,c -> torch i,f,g(=c),o.
# GRU: ONNX z,r,h -> torch r,z,n (the zoo's linear_before_reset=1 is torch's n gate).
_GATE_ORDER = {"lstm": (0, 2, 3, 1), "gru": (1, 0, 2)}


def _reorder_gates(a: np.ndarray, cell: str, hidden: int) -> np.ndarray:
    return np.concatenate([a[g * hidden : (g + 1) * hidden] for g in _GATE_ORDER[cell]])


def _rnn_weights(
    spec: RnnSpec, arrays: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """Convert the zoo's ``layer<i>.<cell>.{W,R,B}`` to ``rnn.weight_ih_l<i>[_reverse]`` etc.

    Returns (torch-keyed arrays, torch key -> ONNX name for error messages,
    shape problems).  ONNX initializers it does not recognise are passed
    through under their own names, so the strict check reports them.
    """
    arrays = dict(arrays)
    out: dict[str, np.ndarray] = {}
    origin: dict[str, str] = {}
    problems: list[str] = []
    gh = (4 if spec.cell == "lstm" else 3) * spec.H
    nd = 2 if spec.bidirectional else 1
    for layer in range(spec.layers):
        e_in = spec.E if layer == 0 else nd * spec.H
        base = f"layer{layer}.{spec.cell}"
        for kind, shape in (("W", (nd, gh, e_in)), ("R", (nd, gh, spec.H)), ("B", (nd, 2 * gh))):
            onnx_name = f"{base}.{kind}"
            sfxs = [f"l{layer}" + ("_reverse" if d else "") for d in range(nd)]
            # Torch key(s) per direction; ONNX B[d] = [Wb | Rb] = bias_ih, bias_hh.
            if kind == "W":
                keys = [[f"rnn.weight_ih_{s}"] for s in sfxs]
            elif kind == "R":
                keys = [[f"rnn.weight_hh_{s}"] for s in sfxs]
            else:
                keys = [[f"rnn.bias_ih_{s}", f"rnn.bias_hh_{s}"] for s in sfxs]
            origin.update({k: onnx_name for per_dir in keys for k in per_dir})
            arr = arrays.pop(onnx_name, None)
            if arr is None:
                continue  # reported as missing torch keys, named via ``origin``
            if tuple(arr.shape) != shape:
                problems.append(f"{onnx_name}: ONNX shape {tuple(arr.shape)}, expected {shape}")
                continue
            for d, per_dir in enumerate(keys):
                for key, part in zip(per_dir, np.split(arr[d], len(per_dir)), strict=True):
                    out[key] = _reorder_gates(part, spec.cell, spec.H)
    out.update(arrays)
    return out, origin, problems


def _check_rnn_graph(spec: RnnSpec, proto: onnx.ModelProto) -> list[str]:
    """Attributes torch's LSTM/GRU cannot express, or that differ from ``spec``."""
    problems = []
    op = spec.cell.upper()
    nodes = [n for n in proto.graph.node if n.op_type in ("LSTM", "GRU", "RNN")]
    if len(nodes) != spec.layers or any(n.op_type != op for n in nodes):
        problems.append(
            f"graph has recurrent ops {[n.op_type for n in nodes]}, expected {spec.layers}x {op}"
        )
    direction = "bidirectional" if spec.bidirectional else "forward"
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        got = attrs.get("direction", b"forward")
        got = got.decode() if isinstance(got, bytes) else got
        if got != direction:
            problems.append(f"{node.name}: direction {got!r}, expected {direction!r}")
        if attrs.get("hidden_size") != spec.H:
            problems.append(
                f"{node.name}: hidden_size {attrs.get('hidden_size')}, expected {spec.H}"
            )
        if attrs.get("layout", 0) != 0:
            problems.append(
                f"{node.name}: layout {attrs['layout']} (only seq-first 0 is supported)"
            )
        if node.op_type == "GRU" and attrs.get("linear_before_reset", 0) != 1:
            problems.append(
                f"{node.name}: linear_before_reset=0; torch.nn.GRU only computes "
                "linear_before_reset=1"
            )
        extra = set(attrs) - {"hidden_size", "direction", "layout", "linear_before_reset"}
        if extra:  # activations, clip, input_forget: not expressible with nn.LSTM/GRU
            problems.append(f"{node.name}: unsupported attributes {sorted(extra)}")
        if len(node.input) > 4 and node.input[4]:
            problems.append(f"{node.name}: sequence_lens is not supported")
        if len(node.input) > 7 and node.input[7]:
            problems.append(f"{node.name}: LSTM peepholes (P) are not supported")
    return problems


# -------------------------------------------------------------------- loading
# (op_type, input slot) pairs whose initializers are operator constants (Clip
# bounds, Dropout ratio, Reshape/Squeeze targets), baked into the torch modules
# as hyperparameters rather than loaded as weights.
_CONSTANT_SLOTS = {
    ("Clip", 1),
    ("Clip", 2),
    ("Dropout", 1),
    ("Dropout", 2),
    ("Reshape", 1),
    ("Squeeze", 1),
    ("Unsqueeze", 1),
}


def _weight_arrays(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The initializers that must become parameters/buffers (zero-copy numpy views)."""
    uses: defaultdict[str, set[tuple[str, int]]] = defaultdict(set)
    for node in graph.node:
        for slot, name in enumerate(node.input):
            uses[name].add((node.op_type, slot))
    return {
        init.name: numpy_helper.to_array(init)
        for init in graph.initializer
        # An unused initializer is kept, so a misnamed weight is reported.
        if not (uses[init.name] and uses[init.name] <= _CONSTANT_SLOTS)
    }


def _check_interface(
    proto: onnx.ModelProto, inputs: list[str], outputs: list[str], name: str
) -> list[str]:
    """forward()'s positional contract: the graph's inputs/outputs, in order."""
    inits = {i.name for i in proto.graph.initializer}
    got_in = [i.name for i in proto.graph.input if i.name not in inits]
    got_out = [o.name for o in proto.graph.output]
    problems = []
    if got_in != inputs:
        problems.append(f"graph inputs {got_in}, the torch {name} takes {inputs}")
    if got_out != outputs:
        problems.append(f"graph outputs {got_out}, the torch {name} returns {outputs}")
    return problems


def _load_weights(
    model: nn.Module,
    arrays: dict[str, np.ndarray],
    origin: dict[str, str],
    problems: list[str],
    name: str,
) -> None:
    """Strictly fill every parameter/buffer of ``model`` (built on the meta device).

    ``num_batches_tracked`` is the one torch buffer with no ONNX counterpart;
    it only sets the BatchNorm momentum during training, so it is set to 0.
    """
    expected = {
        k: tuple(v.shape)
        for k, v in model.state_dict().items()
        if not k.endswith(".num_batches_tracked")
    }

    def label(key: str) -> str:
        src = origin.get(key, key)
        return key if src == key else f"{key} (from ONNX {src})"

    missing = sorted(expected.keys() - arrays.keys())
    unexpected = sorted(arrays.keys() - expected.keys())
    problems = list(problems)
    if missing:
        problems.append("missing weights: " + ", ".join(label(k) for k in missing))
    if unexpected:
        problems.append("unexpected ONNX initializers: " + ", ".join(unexpected))
    for key in sorted(expected.keys() & arrays.keys()):
        if tuple(arrays[key].shape) != expected[key]:
            problems.append(
                f"{label(key)}: ONNX shape {tuple(arrays[key].shape)}, torch {expected[key]}"
            )
    if problems:
        raise ValueError(
            f"ONNX model does not match the PyTorch definition of {name!r}:\n  "
            + "\n  ".join(problems)
        )
    state: dict[str, Tensor] = {
        # A writable float32 copy each: torch.from_numpy shares memory, and the
        # proto's raw bytes are read-only.
        k: torch.from_numpy(np.array(arrays[k], dtype=np.float32, copy=True))
        for k in expected
    }
    for k in model.state_dict():
        if k.endswith(".num_batches_tracked"):
            state[k] = torch.zeros((), dtype=torch.long)
    # assign=True swaps the meta tensors for ours: no throwaway random init
    # (VGG-16 alone is 138M parameters) and no second copy of the weights.
    model.load_state_dict(state, strict=True, assign=True)
    leftover = [k for k, v in [*model.named_parameters(), *model.named_buffers()] if v.is_meta]
    if leftover:  # would be a bug here, not in the caller's model
        raise RuntimeError(f"{name}: tensors left unloaded: {leftover}")


def _unsupported(name: str) -> ValueError:
    return ValueError(
        f"no PyTorch definition for zoo model {name!r}; defined for: "
        f"{', '.join(list_models())}, and parametric lstm|gru-E<E>-H<H>[-B<B>]-T<T>"
        "[-L<layers>][-bi] names (a 'zoo:' prefix is accepted)"
    )


def _rnn_spec(name: str) -> RnnSpec | None:
    try:
        return parse_rnn_name(name)
    except ValueError:  # e.g. zero sizes: not a buildable zoo model
        return None


def has_torch_definition(name: str) -> bool:
    """Whether :func:`torch_model_for` can build zoo model ``name`` (``zoo:`` prefix ok)."""
    return _normalize(name) in TORCH_CNN_MODELS or _rnn_spec(name) is not None


def torch_model_for(name: str, proto: onnx.ModelProto) -> nn.Module:
    """PyTorch definition of zoo model ``name`` with ``proto``'s weights, in eval mode.

    ``name`` is anything :func:`smelt.frontend.zoo.get_model` accepts (e.g.
    ``resnet50``, ``zoo:lstm``, ``lstm-E256-H256-B1-T100-L2-bi``); ``proto``
    is that zoo model (any batch size and seed).  The module's ``forward``
    takes the graph inputs positionally and returns a tuple in graph-output
    order.  Parameters are float32 on the CPU with ``requires_grad=False``.

    Raises ``ValueError`` for a name with no torch definition, or when
    ``proto`` does not fit the definition: missing, unexpected or mis-shaped
    weights (all named in the message), different inputs/outputs, or
    recurrent-op attributes torch cannot express.
    """
    key = _normalize(name)
    if key in TORCH_CNN_MODELS:
        # On the meta device nothing is allocated or randomly initialized;
        # _load_weights then assigns the real tensors.
        with torch.device("meta"):
            model = TORCH_CNN_MODELS[key]()
        problems = _check_interface(proto, ["input"], ["logits"], key)
        _load_weights(model, _weight_arrays(proto.graph), {}, problems, key)
    else:
        spec = _rnn_spec(key)
        if spec is None:
            raise _unsupported(name)
        per_layer = ["h0", "c0"] if spec.cell == "lstm" else ["h0"]
        states = [f"{s}_{i}" for i in range(spec.layers) for s in per_layer]
        graph_inputs = [i.name for i in proto.graph.input]
        with_states = len(graph_inputs) > 1 and graph_inputs[1:] == states
        with torch.device("meta"):
            model = RnnModel(
                spec.cell, spec.E, spec.H, spec.layers, spec.bidirectional, with_states
            )
        problems = _check_interface(
            proto, ["x", *(states if with_states else [])], ["y", "y_h"], key
        )
        problems += _check_rnn_graph(spec, proto)
        arrays, origin, shape_problems = _rnn_weights(spec, _weight_arrays(proto.graph))
        _load_weights(model, arrays, origin, problems + shape_problems, key)
    model.requires_grad_(False)  # inference only: no autograd bookkeeping
    return model.eval()
