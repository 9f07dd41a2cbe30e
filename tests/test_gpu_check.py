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


def test_the_shell_script_takes_options_without_an_out_dir(tmp_path):
    """`gpu_check.sh --quick` (OUT_DIR left out, as `[OUT_DIR] [--quick]` allows) passes --quick on to gpu_check.py
    and writes to $OUT; before, '--quick' became the output folder (`mkdir -p --quick` failed) and was dropped.
    PYTHON is a recorder of its arguments: this tests the script's own argument handling, nothing it runs."""
    import os
    import subprocess

    calls = tmp_path / "calls.txt"
    recorder = tmp_path / "python"
    recorder.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    recorder.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(recorder), "OUT": str(out)}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--quick"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    made = calls.read_text().splitlines()
    assert f"scripts/gpu_check.py --out {out} --quick" in made[-1]
    assert any(c.startswith("-m pytest -q -m gpu tests/test_kernels.py") for c in made)
    assert "-m dflash.bench.profile host-work --json" in made  # on a GPU: the default vocabularies
    assert out.is_dir()
    usage = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--help"], env=env, capture_output=True,
                           text=True, timeout=30)
    assert usage.returncode == 0 and "OUT_DIR" in usage.stdout and "CI-less" in usage.stdout  # the header, whole
    assert "pipefail" not in usage.stdout  # and nothing after it
    assert len(calls.read_text().splitlines()) == len(made)  # --help runs nothing


def test_the_kernel_parity_check_runs_on_the_cpu_and_would_see_a_difference():
    """Check 1 of the GPU check, on the CPU under Triton's interpreter (its own process: the variable must be set
    before a kernel module is imported): every case agrees, and a differing output is counted."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json, sys; sys.path.insert(0, 'scripts'); import gpu_check as g; "
            "print(json.dumps(g.check_kernel_parity(g.parse_args(['--device', 'cpu', '--quick']), 'cpu')))")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"ok": True, "cases": 23, "mismatches": 0, "failures": []}
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check_kernels import Tally

    tally = Tally()
    tally.compare("same", (torch.tensor([1, 2]),), (torch.tensor([1, 2]),))
    tally.compare("one token differs", (torch.tensor([1, 2]),), (torch.tensor([1, 3]),))
    assert tally.result() == {"ok": False, "cases": 2, "mismatches": 1, "failures": ["one token differs"]}
