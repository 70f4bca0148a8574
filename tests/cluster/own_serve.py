"""``fairlane serve`` as a subprocess with a Ray of its own, for the tests whose Serve variables must
be set before Ray starts (the edge, direct ingress): they run before the session's shared Ray."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def own_serve(tmp_path: Path, config: dict, *args: str, prefix: str) -> Iterator[subprocess.Popen[bytes]]:
    """``fairlane serve --config <config> <args>`` in its own session and Ray (no RAY_ADDRESS, a private
    temp dir); its output in ``tmp_path/serve.log``; killed as a group at the end, with any HAProxy
    its Ray left (HAProxy runs in a session of its own)."""
    (tmp_path / "app.yaml").write_text(yaml.safe_dump(config))
    ray_tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths have a limit
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_SERVE_"))}
    env |= {"RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(REPO)}
    fairlane = str(Path(sys.executable).with_name("fairlane"))
    with (tmp_path / "serve.log").open("wb") as out:
        proc = subprocess.Popen(
            [fairlane, "serve", "--config", str(tmp_path / "app.yaml"), *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for pid in pids_with("haproxy"):
            if ray_tmp in environ_of(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def pids_with(text: str) -> list[int]:
    """Processes whose command line holds ``text``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                pids.append(int(entry))
    return pids


def environ_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""
