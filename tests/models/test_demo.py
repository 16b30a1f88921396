"""run_llama_demo: converts the bf16 fixture, generates, reports kernels and the logit error."""

import pytest
import numpy as np

from jqlin.models.demo import run_llama_demo


@pytest.mark.slow
def test_demo_on_the_bf16_fixture(fixtures_dir):
    lines = []
    result = run_llama_demo(fixtures_dir / "bf16", out=lines.append, format="fp8_ptpc",
                            max_new_tokens=3)
    text = "\n".join(lines)
    assert "converting" in text and "fp8_ptpc" in text
    assert len(result["tokens"]) == 3 and len(result["reference_tokens"]) == 3
    assert len(result["kernels"]) == 8  # fused q/k/v, o, fused gate/up, down per layer
    for path, kernel in result["kernels"].items():
        assert kernel is not None
        assert any(path in line and f"-> {kernel}" in line for line in lines), path
    assert 1e-3 < result["logit_rel_error"] < 0.2  # quantized, but the same model
    assert f"{result['logit_rel_error']:.3e}" in text
    assert 0 <= result["top1_agreement"] <= 1


def test_demo_on_a_quantized_fixture_without_reference(fixtures_dir):
    lines = []
    result = run_llama_demo(fixtures_dir / "modelopt_fp8_pb_wo", out=lines.append, max_new_tokens=2)
    assert "logit_rel_error" not in result and "not computed" in lines[-1]
    assert all(k is not None for k in result["kernels"].values())
    assert np.asarray(result["tokens"]).shape == (2,)
