"""scripts/gpu_check.py's checks run on the CPU too: what the GPU check asserts is proven here on real models."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_oracle_check_accepts_every_block_and_stays_lossless(gpu_check, tmp_path):
    args = gpu_check.parse_args(["--device", "cpu", "--out", str(tmp_path), "--prompts", "1", "--tokens", "8"])
    result = gpu_check.check_oracle(args, "cpu")
    # 2 kernel modes × (1 greedy + 1 sampled prompt); a failure lists the blocks not accepted whole
    assert result["runs"] == 4 and result["failures"] == [] and result["ok"]
