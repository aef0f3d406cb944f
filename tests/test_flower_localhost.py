"""fedlib over a real Flower deployment on localhost (``make test-flower``, marker ``flower``): a
SuperLink and 3 SuperNodes as separate processes on their own free ports, in Flower's *insecure
localhost test mode* (no TLS, no node authentication: never across sites, README "Across sites"),
federations submitted with ``flwr run``. ``flwr run`` exits 0 even when the ServerApp failed, so
each run's status is read back with ``flwr ls --format json``; the global files are compared
byte for byte with ``fedlib client-mask`` + ``fedlib aggregate`` on the same sites' data. The
SuperLink is killed and started again between two rounds of an iterative federation, which the
coordinator then resumes from its files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedlib.cli import main
from fedlib.data import save_tokens

pytestmark = pytest.mark.flower

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / ".test" / "model"
BIN = Path(sys.executable).parent
SITES = ["site-a", "site-b", "site-c"]
CONNECTION = "localhost-insecure-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Localhost:
    """The processes of one localhost deployment, their logs under ``root``."""

    def __init__(self, root: Path):
        self.root, self.procs = root, {}
        self.port = free_port()
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "FLWR_HOME": str(root / "flwr")}
        (root / "flwr").mkdir()
        (root / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')

    def start(self, name: str, *argv) -> None:
        log = open(self.root / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([str(BIN / argv[0]), *map(str, argv[1:])], env=self.env, cwd=self.root,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def superlink(self) -> None:
        # its state in a database, as a coordinator runs it: the SuperNodes stay registered across a restart
        self.start("superlink", "flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                   "--port", self.port, "--database", self.root / "superlink.db")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)  # its session: the SuperExec and app processes it started
        proc.wait()

    def flwr(self, *argv) -> str:
        done = subprocess.run([str(BIN / "flwr"), *map(str, argv)], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"flwr {argv}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def run(self, out: Path, **config) -> int:
        values = {"model": str(MODEL), "out": str(out), "min-clients": 3, "connect-timeout": 60.0,
                  "round-deadline": 120.0, **config}
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())
        reply = json.loads(self.flwr("run", REPO / "flower", CONNECTION, "--run-config", text, "--format", "json"))
        return int(reply["run-id"])

    def status(self, run_id: int) -> dict:
        (run,) = json.loads(self.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json"))["runs"]
        return run

    def wait(self, run_id: int, timeout: float = 180.0) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            run = self.status(run_id)
            if run["status"].startswith("finished"):
                return run
            time.sleep(1.0)
        raise AssertionError(f"run {run_id} not finished after {timeout} s: {self.status(run_id)}")

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@pytest.fixture
def deployment(tmp_path):
    site = Localhost(tmp_path)
    site.superlink()
    time.sleep(3)
    for i, cid in enumerate(SITES):
        calib = tmp_path / f"{cid}.tokens.safetensors"
        save_tokens(calib, torch.randint(0, 257, (3, 16), generator=torch.Generator().manual_seed(i)))
        site.start(cid, "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{site.port}",
                   "--port", free_port(), "--node-config", f'model="{MODEL}" calib="{calib}" client-id="{cid}"')
    yield site
    site.close()


def cli(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


def file_protocol(root: Path, data: Path, rounds: int, *extra) -> Path:
    """The global file of ``fedlib client-mask`` + ``fedlib aggregate`` on the sites' data."""
    previous = None
    for t in range(rounds):
        files = []
        iterative = ["--round", t, *(["--global-masks", previous] if previous else [])] if rounds > 1 else []
        for cid in SITES:
            files.append(root / f"cli{t}" / f"{cid}.mask.safetensors")
            files[-1].parent.mkdir(parents=True, exist_ok=True)
            cli("client-mask", "--model", MODEL, "--calib", data / f"{cid}.tokens.safetensors", "--client-id", cid,
                "--out", files[-1], *extra, *iterative)
        out = root / f"cli{t}.global.safetensors"
        mode = ["--mode", "iterative", "--round", t, *(["--previous", previous] if previous else [])] if rounds > 1 else []
        cli("aggregate", "--model", MODEL, "--out", out, *mode, *files)
        previous = out
    return previous


def test_one_shot_and_iterative_over_flower_on_localhost(deployment, tmp_path):
    run_id = deployment.run(tmp_path / "one-shot", **{"format-version": 2})
    run = deployment.wait(run_id)
    assert run["status"] == "finished:completed", run
    assert (tmp_path / "one-shot" / "global.mask.safetensors").read_bytes() == \
        file_protocol(tmp_path / "a", tmp_path, 1, "--format-version", 2).read_bytes()
    assert run["network-traffic"]["inbound-bytes"] > sum(
        p.stat().st_size for p in (tmp_path / "one-shot" / "round-000").glob("site-*.mask.safetensors"))

    # iterative: the SuperLink dies after round 0 and comes back; the federation, started again,
    # resumes at round 1 from the global file the coordinator wrote (the SuperNodes reconnect)
    run_id = deployment.run(tmp_path / "iterative", mode="iterative")
    record = tmp_path / "iterative" / "federation.json"
    end = time.monotonic() + 120
    while not (record.is_file() and json.loads(record.read_text())["rounds"]):
        assert time.monotonic() < end and deployment.status(run_id)["status"] != "finished:failed", \
            deployment.status(run_id)
        time.sleep(0.5)
    deployment.stop("superlink")
    deployment.superlink()
    time.sleep(3)
    run_id = deployment.run(tmp_path / "iterative", mode="iterative")
    run = deployment.wait(run_id)
    assert run["status"] == "finished:completed", run["status-details"]
    state = json.loads(record.read_text())
    assert state["status"] == "completed" and state["resumed_at_round"] == [1]
    assert (tmp_path / "iterative" / "global.mask.safetensors").read_bytes() == \
        file_protocol(tmp_path / "b", tmp_path, 2).read_bytes()


def test_a_failed_serverapp_is_reported_failed(deployment, tmp_path):
    """``flwr run`` returns 0 for a ServerApp that raised; ``flwr ls`` says so."""
    run_id = deployment.run(tmp_path / "bad", model=str(tmp_path / "no-such-model"))
    assert deployment.wait(run_id)["status"] == "finished:failed"
