"""A PostgreSQL for the ledger tests: the one at FAIRLANE_TEST_PG_DSN (default 127.0.0.1:5432), else
one started here with initdb and pg_ctl in a temporary folder, else none (the tests then skip).

    eval "$(python -m tests.cluster.ledger.postgres_server)"   # by hand: exports FAIRLANE_TEST_PG_DSN

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` user (or ``nobody``).
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import asyncpg

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
ENV = "FAIRLANE_TEST_PG_DSN"


def configured_dsn() -> str:
    return os.environ.get(ENV, DEFAULT_DSN)


def reachable(dsn: str, timeout_s: float = 3.0) -> bool:
    async def probe() -> bool:
        try:
            conn = await asyncpg.connect(dsn, timeout=timeout_s)
        except Exception:
            return False
        await conn.close()
        return True

    return asyncio.run(probe())


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runner() -> tuple[list[str], str | None]:
    """The command prefix that runs PostgreSQL's tools as a non-root user, and that user."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", user, "--"], user
    return [], None


@dataclass
class LocalServer:
    dsn: str
    data: Path
    pg_ctl: str
    prefix: list[str]

    def stop(self, remove: bool = False) -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", "fast", "stop"], check=False)
        if remove:
            shutil.rmtree(self.data.parent, ignore_errors=True)

    def start(self) -> None:
        log = self.data / "server.log"
        command = [*self.prefix, self.pg_ctl, "-D", str(self.data), "-l", str(log), "-w", "start"]
        subprocess.run(command, check=True)


def start_local() -> LocalServer | None:
    """initdb + pg_ctl start on a free port; None when the tools are missing or cannot run."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not initdb or not pg_ctl:
        return None
    prefix, user = _runner()
    if os.geteuid() == 0 and user is None:
        return None
    root = Path(tempfile.mkdtemp(prefix="fairlane-pg-"))
    data = root / "data"
    if user is not None:
        shutil.chown(root, user)
    port = _free_port()
    init = [*prefix, initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"]
    if subprocess.run(init, capture_output=True, check=False).returncode != 0:
        return None
    conf = data / "postgresql.conf"
    settings = (
        f"\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\nfsync = off\n"
    )
    with conf.open("a") as f:
        f.write(settings)
    server = LocalServer(f"postgresql://postgres@127.0.0.1:{port}/postgres", data, pg_ctl, prefix)
    try:
        server.start()
    except subprocess.CalledProcessError:
        return None
    return server


def main() -> None:
    """Print the export line of a reachable PostgreSQL (started here if none answers), or nothing."""
    dsn = configured_dsn()
    if reachable(dsn):
        print(f"export {ENV}={dsn}")
        return
    server = start_local()
    if server is not None and reachable(server.dsn):
        print(f"export {ENV}={server.dsn}")


if __name__ == "__main__":
    main()
