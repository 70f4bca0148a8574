"""Running a benchmark's `--smoke` mode as a user would (`python -m bench.NAME --smoke --out F`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_smoke(module: str, out: Path, timeout_s: float = 300) -> tuple[dict, str]:
    """The report the smoke run wrote to `out`, and what it printed; fails the test on a non-zero exit."""
    cmd = [sys.executable, "-m", module, "--smoke", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout
