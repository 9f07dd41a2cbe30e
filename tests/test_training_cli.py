"""`python -m dflash train …` through a subprocess: bad options get one line naming the option, exit status 2."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("lo,hi", [("160", "160"), ("500", "100"), ("-1", "160")])
def test_a_bad_prompt_token_range_names_the_option_and_writes_nothing(tmp_path, lo, hi):
    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "dflash", "train", "data-tf", "--out", str(out), "--min-prompt-tokens",
                           lo, "--max-prompt-tokens", hi], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --min-prompt-tokens:"), proc.stderr
    assert not out.exists()
