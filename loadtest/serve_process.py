"""``fairlane serve`` as a child process for a benchmark: start, wait for ``/health``, stop, log tails.

The child runs ``fairlane.cli`` through ``python -c`` (a machine with the packages on PYTHONPATH but
no installed ``fairlane`` entry point works the same), in a process group of its own, with Ray's
session files under the run's own folder (``RAY_TMPDIR``), so that its logs can be collected and
nothing of another Ray on the machine is read or touched.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SERVE_CODE = "from fairlane.cli import main; main()"
REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """One ``fairlane serve --config CONFIG --port PORT`` child; ``stop`` always ends it."""

    def __init__(self, config: Path, port: int, workdir: Path) -> None:
        self.config = config
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / "serve.log"
        self.ray_dir = workdir / "ray"
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.ray_dir.mkdir(parents=True, exist_ok=True)
        env = os.environ | {
            "RAY_TMPDIR": str(self.ray_dir),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        }
        args = ["serve", "--config", str(self.config), "--port", str(self.port)]
        cmd = [sys.executable, "-c", SERVE_CODE, *args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True
            )

    def wait_ready(self, timeout_s: float, min_replicas: int = 1) -> float:
        """Seconds until ``/health`` counts ``min_replicas`` replicas; raises if the child died or hung."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"fairlane serve exited early; see {self.log_path}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2.0)
                if r.status_code == 200 and r.json().get("replicas", 0) >= min_replicas:
                    return time.monotonic() - t0
            except (httpx.HTTPError, ValueError):
                pass  # not listening yet
            time.sleep(1.0)
        raise TimeoutError(f"fairlane serve not ready within {timeout_s:.0f}s; see {self.log_path}")

    def stop(self, grace_s: float = 60.0) -> int | None:
        """SIGTERM (the CLI drains, then shuts Serve and Ray down); SIGKILL to its group after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this class started, nothing else
            return self.proc.wait(10)

    def log_tails(self, lines: int = 80, max_files: int = 12) -> str:
        """The end of serve.log and of each Serve log (router, replica, proxy, controller) of this run."""
        parts = [_tail(self.log_path, lines * 3)]
        # RAY_TMPDIR/ray/session_<stamp>/logs; session_latest links to it, hence the set of real paths.
        serve_logs = sorted({p.resolve() for p in self.ray_dir.glob("**/logs/serve/*.log")})[:max_files]
        # A replica that crashes (CUDA out of memory, an import error) says why in its worker's stderr.
        errs = {p.resolve() for p in self.ray_dir.glob("**/logs/worker-*.err") if p.stat().st_size > 0}
        errs = sorted(errs, key=lambda p: p.stat().st_size, reverse=True)[:4]
        parts += [_tail(p, lines) for p in (*serve_logs, *errs)]
        return "\n".join(parts)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"==> {path}: unreadable ({exc.strerror}) <=="
    return "\n".join([f"==> {path} (last {len(text)} lines) <==", *text])
