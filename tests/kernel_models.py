"""Shared pieces of the GEMM and convolution kernel tests: cases packed into one model, and
forcing a vector ISA so the AVX2 and portable templates are tested on this host too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import make_model
from onnx import helper

from smelt.target import detect

RNG = np.random.default_rng(20261122)


def _rand(*shape) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


@dataclasses.dataclass
class Case:
    name: str
    nodes: list
    inputs: list
    inits: list
    output: str
    feeds: dict



def _model(cases: list[Case]):
    nodes, inputs, inits, outputs, feeds = [], [], [], [], {}
    for c in cases:
        nodes += c.nodes
        inputs += c.inputs
        inits += c.inits
        outputs.append(helper.make_tensor_value_info(c.output, 1, None))
        feeds.update(c.feeds)
    return make_model(nodes, inputs, outputs, inits), feeds


def _isa_target(isa: str):
    real = detect()
    if isa == "native":
        return real
    if isa == "avx2":
        if "avx2" not in real.flags or real.arch != "x86_64":
            pytest.skip("host has no AVX2")
        return dataclasses.replace(real, isa="avx2", vector_bits=256, vector_registers=16)
    return dataclasses.replace(real, isa="scalar", vector_bits=32, vector_registers=16)


