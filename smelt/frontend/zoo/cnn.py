"""Image-classification CNNs for the zoo, layer for layer like torchvision.

The layer structure, channel counts, strides, paddings and hence parameter
counts follow torchvision's reference implementations, so latency measured
here is comparable with numbers for the same networks in other runtimes.
Names follow torchvision's module paths where practical (``layer1.0.conv1``,
``features.denseblock1.denselayer1.norm1``, ``Mixed_5b.branch1x1.conv``), so a
per-layer profile can be read against the familiar architecture.

All models take ``input`` [batch, 3, 224, 224] float32 NCHW (299x299 for
Inception-v3) and return ``logits`` [batch, 1000].  ``batch`` may be an int or
a string for a symbolic batch dimension.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from .builder import Dim, ModelBuilder

# Learnable parameter counts of the reference architectures (torchvision),
# used by the tests.  Inception-v3 excludes the auxiliary classifier
# (27,161,264 with it; AuxLogits holds 3,326,696 parameters).
REFERENCE_PARAMS: dict[str, int] = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "mobilenet_v2": 3_504_872,
    "squeezenet1_1": 1_235_496,
    "densenet121": 7_978_856,
    "inception_v3": 23_834_568,
}

# Scale range for the last BatchNorm of a residual branch.  Trained residual
# nets learn small scales there (and "zero-gamma" init starts at 0); without
# it, the sum over 16+ blocks would let activations grow without bound.
RESIDUAL_GAMMA = (0.1, 0.5)


def _classifier_head(
    b: ModelBuilder, x: str, dropout: float | None = None, fc_name: str = "fc"
) -> str:
    """GlobalAveragePool + (Dropout) + Flatten + Gemm -> ``logits``."""
    x = b.global_avgpool(x, name="avgpool")
    if dropout is not None:
        x = b.dropout(x, dropout, name="dropout")
    x = b.flatten(x, name="flatten")
    x = b.gemm(x, 1000, name=fc_name)
    return b.output(x, "logits")


# --------------------------------------------------------------------- ResNet
def _basic_block(b: ModelBuilder, x: str, planes: int, stride: int) -> str:
    identity = x
    out = b.conv(x, planes, 3, stride, 1, name="conv1")
    out = b.relu(b.batchnorm(out, name="bn1"), name="relu1")
    out = b.conv(out, planes, 3, 1, 1, name="conv2")
    out = b.batchnorm(out, name="bn2", gamma=RESIDUAL_GAMMA)
    if stride != 1 or b.channels(x) != planes:
        with b.scope("downsample"):
            identity = b.batchnorm(b.conv(x, planes, 1, stride, name="0"), name="1")
    return b.relu(b.add(out, identity, name="add"), name="relu2")


def _bottleneck(b: ModelBuilder, x: str, planes: int, stride: int) -> str:
    # v1.5: the stride sits on the 3x3 conv, not the first 1x1.
    identity = x
    out = b.relu(b.batchnorm(b.conv(x, planes, 1, name="conv1"), name="bn1"), name="relu1")
    out = b.conv(out, planes, 3, stride, 1, name="conv2")
    out = b.relu(b.batchnorm(out, name="bn2"), name="relu2")
    out = b.conv(out, planes * 4, 1, name="conv3")
    out = b.batchnorm(out, name="bn3", gamma=RESIDUAL_GAMMA)
    if stride != 1 or b.channels(x) != planes * 4:
        with b.scope("downsample"):
            identity = b.batchnorm(b.conv(x, planes * 4, 1, stride, name="0"), name="1")
    return b.relu(b.add(out, identity, name="add"), name="relu3")


def _resnet(
    name: str,
    block: Callable[[ModelBuilder, str, int, int], str],
    layers: list[int],
    batch: Dim,
    seed: int,
) -> onnx.ModelProto:
    b = ModelBuilder(seed)
    x = b.input("input", [batch, 3, 224, 224])
    x = b.conv(x, 64, 7, 2, 3, name="conv1")
    x = b.relu(b.batchnorm(x, name="bn1"), name="relu")
    x = b.maxpool(x, 3, 2, 1, name="maxpool")
    for stage, (planes, blocks) in enumerate(zip([64, 128, 256, 512], layers, strict=True)):
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            with b.scope(f"layer{stage + 1}"), b.scope(i):
                x = block(b, x, planes, stride)
    _classifier_head(b, x)
    return b.build(name)


def resnet18(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 (BasicBlock x [2,2,2,2]), 11.69M parameters."""
    return _resnet("resnet18", _basic_block, [2, 2, 2, 2], batch, seed)


def resnet50(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 v1.5 (Bottleneck x [3,4,6,3], stride on the 3x3), 25.56M parameters."""
    return _resnet("resnet50", _bottleneck, [3, 4, 6, 3], batch, seed)


# ------------------------------------------------------------------------ VGG
_VGG16_CFG: list[int | str] = [
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
]


def vgg16(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """VGG-16 (configuration D, no BatchNorm), 138.36M parameters.

    The classifier keeps both Dropout layers so dropout elimination has work
    to do.  torchvision's AdaptiveAvgPool2d((7, 7)) is the identity at 224x224
    and is omitted; the last MaxPool output is flattened directly.
    """
    b = ModelBuilder(seed)
    x = b.input("input", [batch, 3, 224, 224])
    idx = 0
    with b.scope("features"):
        for v in _VGG16_CFG:
            if v == "M":
                x = b.maxpool(x, 2, 2, name=str(idx))
                idx += 1
            else:
                x = b.conv(x, int(v), 3, 1, 1, bias=True, name=str(idx))
                x = b.relu(x, name=str(idx + 1))
                idx += 2
    x = b.flatten(x, name="flatten")
    with b.scope("classifier"):
        x = b.relu(b.gemm(x, 4096, name="0"), name="1")
        x = b.dropout(x, 0.5, name="2")
        x = b.relu(b.gemm(x, 4096, name="3"), name="4")
        x = b.dropout(x, 0.5, name="5")
        x = b.gemm(x, 1000, name="6")
    b.output(x, "logits")
    return b.build("vgg16")


# ---------------------------------------------------------------- MobileNetV2
def _conv_bn_relu6(
    b: ModelBuilder, x: str, out: int, k: int, stride: int = 1, groups: int = 1, name: str = "conv"
) -> str:
    x = b.conv(x, out, k, stride, (k - 1) // 2, groups=groups, name=name)
    x = b.batchnorm(x, name=f"{name}_bn")
    return b.clip(x, 0.0, 6.0, name=f"{name}_relu6")


def mobilenet_v2(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0), 3.50M parameters.

    ReLU6 is Clip(0, 6); depthwise convs are Conv with group == channels;
    inverted residual blocks add the skip when stride 1 and shapes match.
    """
    settings = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]
    b = ModelBuilder(seed)
    x = b.input("input", [batch, 3, 224, 224])
    idx = 0
    with b.scope("features"):
        with b.scope(idx):
            x = _conv_bn_relu6(b, x, 32, 3, 2)
        idx += 1
        for t, c, n, s in settings:
            for i in range(n):
                stride = s if i == 0 else 1
                cin = b.channels(x)
                hidden = cin * t
                with b.scope(idx):
                    out = x
                    if t != 1:
                        out = _conv_bn_relu6(b, out, hidden, 1, name="expand")
                    out = _conv_bn_relu6(b, out, hidden, 3, stride, groups=hidden, name="dw")
                    out = b.conv(out, c, 1, name="project")
                    residual = stride == 1 and cin == c
                    out = b.batchnorm(
                        out, name="project_bn", gamma=RESIDUAL_GAMMA if residual else (0.8, 1.2)
                    )
                    if residual:
                        out = b.add(x, out, name="add")
                x = out
                idx += 1
        with b.scope(idx):
            x = _conv_bn_relu6(b, x, 1280, 1)
    _classifier_head(b, x, dropout=0.2, fc_name="classifier.1")
    return b.build("mobilenet_v2")


# ----------------------------------------------------------------- SqueezeNet
def _fire(b: ModelBuilder, x: str, squeeze: int, e1: int, e3: int) -> str:
    s = b.relu(b.conv(x, squeeze, 1, bias=True, name="squeeze"), name="squeeze_activation")
    a = b.relu(b.conv(s, e1, 1, bias=True, name="expand1x1"), name="expand1x1_activation")
    c = b.relu(b.conv(s, e3, 3, 1, 1, bias=True, name="expand3x3"), name="expand3x3_activation")
    return b.concat([a, c], name="concat")


def squeezenet1_1(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1, 1.235M parameters.

    Faithful to the original, the classifier is Dropout + 1x1 Conv(512->1000)
    + ReLU + GlobalAveragePool + Flatten rather than a Gemm (same parameter
    count as a 512x1000 Gemm); pools use ceil_mode like torchvision.
    """
    fires = {
        3: (16, 64, 64),
        4: (16, 64, 64),
        6: (32, 128, 128),
        7: (32, 128, 128),
        9: (48, 192, 192),
        10: (48, 192, 192),
        11: (64, 256, 256),
        12: (64, 256, 256),
    }
    b = ModelBuilder(seed)
    x = b.input("input", [batch, 3, 224, 224])
    with b.scope("features"):
        x = b.relu(b.conv(x, 64, 3, 2, bias=True, name="0"), name="1")
        for idx in range(2, 13):
            if idx in fires:
                with b.scope(idx):
                    x = _fire(b, x, *fires[idx])
            else:
                x = b.maxpool(x, 3, 2, ceil_mode=True, name=str(idx))
    with b.scope("classifier"):
        x = b.dropout(x, 0.5, name="0")
        x = b.relu(b.conv(x, 1000, 1, bias=True, name="1"), name="2")
        x = b.global_avgpool(x, name="3")
    x = b.flatten(x, name="flatten")
    b.output(x, "logits")
    return b.build("squeezenet1_1")


# ------------------------------------------------------------------- DenseNet
def densenet121(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """DenseNet-121 (growth 32, blocks [6, 12, 24, 16], bn_size 4), 7.98M parameters.

    Dense layers are pre-activation BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 whose
    output is concatenated onto the running feature map; transitions halve
    channels with a 1x1 conv and AvgPool 2x2.
    """
    growth, bn_size = 32, 4
    b = ModelBuilder(seed)
    x = b.input("input", [batch, 3, 224, 224])
    with b.scope("features"):
        x = b.conv(x, 64, 7, 2, 3, name="conv0")
        x = b.relu(b.batchnorm(x, name="norm0"), name="relu0")
        x = b.maxpool(x, 3, 2, 1, name="pool0")
        for bi, n_layers in enumerate([6, 12, 24, 16]):
            with b.scope(f"denseblock{bi + 1}"):
                for li in range(n_layers):
                    with b.scope(f"denselayer{li + 1}"):
                        y = b.relu(b.batchnorm(x, name="norm1"), name="relu1")
                        y = b.conv(y, bn_size * growth, 1, name="conv1")
                        y = b.relu(b.batchnorm(y, name="norm2"), name="relu2")
                        y = b.conv(y, growth, 3, 1, 1, name="conv2")
                        x = b.concat([x, y], name="concat")
            if bi != 3:
                with b.scope(f"transition{bi + 1}"):
                    x = b.relu(b.batchnorm(x, name="norm"), name="relu")
                    x = b.conv(x, b.channels(x) // 2, 1, name="conv")
                    x = b.avgpool(x, 2, 2, name="pool")
        x = b.batchnorm(x, name="norm5")
    x = b.relu(x, name="relu")
    _classifier_head(b, x, fc_name="classifier")
    return b.build("densenet121")


# --------------------------------------------------------------- Inception-v3
def _basic(
    b: ModelBuilder,
    x: str,
    out: int,
    k: int | tuple[int, int],
    stride: int = 1,
    pad: int | tuple[int, int] = 0,
    name: str = "conv",
) -> str:
    """torchvision's BasicConv2d: Conv (no bias) + BatchNorm + ReLU."""
    with b.scope(name):
        x = b.conv(x, out, k, stride, pad, name="conv")
        return b.relu(b.batchnorm(x, name="bn"), name="relu")


def _avg3(b: ModelBuilder, x: str) -> str:
    # F.avg_pool2d(x, 3, stride=1, padding=1): count_include_pad=True.
    return b.avgpool(x, 3, 1, 1, count_include_pad=True, name="branch_pool_avg")


def _inception_a(b: ModelBuilder, x: str, pool_features: int) -> str:
    b1 = _basic(b, x, 64, 1, name="branch1x1")
    b5 = _basic(b, x, 48, 1, name="branch5x5_1")
    b5 = _basic(b, b5, 64, 5, pad=2, name="branch5x5_2")
    b3 = _basic(b, x, 64, 1, name="branch3x3dbl_1")
    b3 = _basic(b, b3, 96, 3, pad=1, name="branch3x3dbl_2")
    b3 = _basic(b, b3, 96, 3, pad=1, name="branch3x3dbl_3")
    bp = _basic(b, _avg3(b, x), pool_features, 1, name="branch_pool")
    return b.concat([b1, b5, b3, bp], name="concat")


def _inception_b(b: ModelBuilder, x: str) -> str:
    b3 = _basic(b, x, 384, 3, stride=2, name="branch3x3")
    bd = _basic(b, x, 64, 1, name="branch3x3dbl_1")
    bd = _basic(b, bd, 96, 3, pad=1, name="branch3x3dbl_2")
    bd = _basic(b, bd, 96, 3, stride=2, name="branch3x3dbl_3")
    bp = b.maxpool(x, 3, 2, name="branch_pool")
    return b.concat([b3, bd, bp], name="concat")


def _inception_c(b: ModelBuilder, x: str, c7: int) -> str:
    b1 = _basic(b, x, 192, 1, name="branch1x1")
    b7 = _basic(b, x, c7, 1, name="branch7x7_1")
    b7 = _basic(b, b7, c7, (1, 7), pad=(0, 3), name="branch7x7_2")
    b7 = _basic(b, b7, 192, (7, 1), pad=(3, 0), name="branch7x7_3")
    bd = _basic(b, x, c7, 1, name="branch7x7dbl_1")
    bd = _basic(b, bd, c7, (7, 1), pad=(3, 0), name="branch7x7dbl_2")
    bd = _basic(b, bd, c7, (1, 7), pad=(0, 3), name="branch7x7dbl_3")
    bd = _basic(b, bd, c7, (7, 1), pad=(3, 0), name="branch7x7dbl_4")
    bd = _basic(b, bd, 192, (1, 7), pad=(0, 3), name="branch7x7dbl_5")
    bp = _basic(b, _avg3(b, x), 192, 1, name="branch_pool")
    return b.concat([b1, b7, bd, bp], name="concat")


def _inception_d(b: ModelBuilder, x: str) -> str:
    b3 = _basic(b, x, 192, 1, name="branch3x3_1")
    b3 = _basic(b, b3, 320, 3, stride=2, name="branch3x3_2")
    b7 = _basic(b, x, 192, 1, name="branch7x7x3_1")
    b7 = _basic(b, b7, 192, (1, 7), pad=(0, 3), name="branch7x7x3_2")
    b7 = _basic(b, b7, 192, (7, 1), pad=(3, 0), name="branch7x7x3_3")
    b7 = _basic(b, b7, 192, 3, stride=2, name="branch7x7x3_4")
    bp = b.maxpool(x, 3, 2, name="branch_pool")
    return b.concat([b3, b7, bp], name="concat")


def _inception_e(b: ModelBuilder, x: str) -> str:
    b1 = _basic(b, x, 320, 1, name="branch1x1")
    b3 = _basic(b, x, 384, 1, name="branch3x3_1")
    b3 = b.concat(
        [
            _basic(b, b3, 384, (1, 3), pad=(0, 1), name="branch3x3_2a"),
            _basic(b, b3, 384, (3, 1), pad=(1, 0), name="branch3x3_2b"),
        ],
        name="branch3x3_concat",
    )
    bd = _basic(b, x, 448, 1, name="branch3x3dbl_1")
    bd = _basic(b, bd, 384, 3, pad=1, name="branch3x3dbl_2")
    bd = b.concat(
        [
            _basic(b, bd, 384, (1, 3), pad=(0, 1), name="branch3x3dbl_3a"),
            _basic(b, bd, 384, (3, 1), pad=(1, 0), name="branch3x3dbl_3b"),
        ],
        name="branch3x3dbl_concat",
    )
    bp = _basic(b, _avg3(b, x), 192, 1, name="branch_pool")
    return b.concat([b1, b3, bd, bp], name="concat")


def inception_v3(batch: Dim = 1, seed: int = 0) -> onnx.ModelProto:
    """Inception-v3 at 299x299 without the auxiliary head, 23.83M parameters.

    Includes the factorized 1x7/7x1 and 1x3/3x1 convs, 3x3/s1/p1 AvgPool
    branches (count_include_pad, as torchvision) and MaxPool reduction
    branches.  torchvision's optional ``transform_input`` is not applied.
    """
    b = ModelBuilder(seed)
    x = b.input("input", [batch, 3, 299, 299])
    x = _basic(b, x, 32, 3, stride=2, name="Conv2d_1a_3x3")
    x = _basic(b, x, 32, 3, name="Conv2d_2a_3x3")
    x = _basic(b, x, 64, 3, pad=1, name="Conv2d_2b_3x3")
    x = b.maxpool(x, 3, 2, name="maxpool1")
    x = _basic(b, x, 80, 1, name="Conv2d_3b_1x1")
    x = _basic(b, x, 192, 3, name="Conv2d_4a_3x3")
    x = b.maxpool(x, 3, 2, name="maxpool2")
    for name, pf in [("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)]:
        with b.scope(name):
            x = _inception_a(b, x, pf)
    with b.scope("Mixed_6a"):
        x = _inception_b(b, x)
    for name, c7 in [("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)]:
        with b.scope(name):
            x = _inception_c(b, x, c7)
    with b.scope("Mixed_7a"):
        x = _inception_d(b, x)
    for name in ["Mixed_7b", "Mixed_7c"]:
        with b.scope(name):
            x = _inception_e(b, x)
    _classifier_head(b, x, dropout=0.5)
    return b.build("inception_v3")


CNN_MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": vgg16,
    "mobilenet_v2": mobilenet_v2,
    "squeezenet1_1": squeezenet1_1,
    "densenet121": densenet121,
    "inception_v3": inception_v3,
}
