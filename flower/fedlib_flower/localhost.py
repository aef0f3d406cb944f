"""A Flower deployment on this machine in Flower's *insecure* mode (no TLS, no node
authentication): for ``make test-flower`` and ``benchmarks/bench_flower.py`` only, never across
sites (README "Across sites" has the secure deployment). A SuperLink (state in a database, so
SuperNodes stay registered across its restart) and SuperNodes on free loopback ports, each a
process group of its own, logs under ``root``; ``flwr`` talks to it through the connection
:data:`CONNECTION` in a private ``FLWR_HOME``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CONNECTION = "localhost-insecure-test"
#: the app folder ``flwr run`` ships
APP = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"process {pid}: no VmHWM in /proc/{pid}/status")


class Localhost:
    """The processes of one localhost deployment (module docstring)."""

    def __init__(self, root: Path):
        self.root, self.procs = Path(root), {}
        self.port = free_port()
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                    "FLWR_HOME": str(self.root / "flwr")}
        (self.root / "flwr").mkdir(parents=True, exist_ok=True)
        (self.root / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')

    def start(self, name: str, *argv) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([str(BIN / str(argv[0])), *map(str, argv[1:])], env=self.env,
                                                cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def superlink(self) -> None:
        self.start("superlink", "flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                   "--port", self.port, "--database", self.root / "superlink.db")

    def supernode(self, name: str, node_config: dict) -> None:
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
        self.start(name, "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                   "--port", free_port(), "--node-config", config)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)  # its group: the SuperExec and app processes it started
        proc.wait()

    def flwr(self, *argv) -> str:
        done = subprocess.run([str(BIN / "flwr"), *map(str, argv)], env=self.env, cwd=self.root,
                              capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"flwr {' '.join(map(str, argv))}: exit {done.returncode}: {done.stdout}{done.stderr}")
        return done.stdout

    def run(self, config: dict) -> int:
        """Submit a federation (``flwr run``); its run id."""
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in config.items())
        return int(json.loads(self.flwr("run", APP, CONNECTION, "--run-config", text, "--format", "json"))["run-id"])

    def status(self, run_id: int) -> dict:
        """``flwr ls`` of one run: its status ("finished:completed", ...) and Flower's own counts."""
        (run,) = json.loads(self.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json"))["runs"]
        return run

    def wait(self, run_id: int, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            run = self.status(run_id)
            if run["status"].startswith("finished"):
                return run
            time.sleep(1.0)
        raise TimeoutError(f"run {run_id} not finished after {timeout} s: {self.status(run_id)}")

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)
