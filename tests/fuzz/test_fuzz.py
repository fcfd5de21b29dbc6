"""A short fuzz run in the default suite (the 10,000-model run is in .ci/run).

Seeded, so it is the same few hundred mutated models every time: no crash, no hang, only
``SmeltError`` refusals or C source in process, and a couple of compiled samples that agree
with onnxruntime (see fuzz_models.py for the contract).
"""

from __future__ import annotations

import pytest

from fuzz.fuzz_models import fuzz, seed_models


def test_seed_models_compile_to_c_for_every_target() -> None:
    from fuzz.fuzz_models import generate_c, targets

    for model in seed_models():
        for target in targets():
            assert "smelt" in generate_c(model.SerializeToString(), target)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # mutated constants overflow numpy casts
def test_short_fuzz_run(tmp_path) -> None:
    stats = fuzz(iterations=300, seconds=240, seed=20261123, compile_sample=2, save=tmp_path, progress=False)
    assert stats.failures == [], "\n".join(stats.failures)
    assert stats.iterations == 300
    # the run exercised both sides of the contract
    assert stats.generated > 30 and sum(stats.refused.values()) > 30, stats.summary()
    assert stats.sampled == 2 and stats.agreed == 2, stats.summary()
