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
import sys
import time
from pathlib import Path

import pytest
import torch

from fedlib.cli import main
from fedlib.data import save_tokens

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "flower"))  # the app folder `flwr run` ships
from fedlib_flower.localhost import Localhost  # noqa: E402

pytestmark = pytest.mark.flower
MODEL = REPO / ".test" / "model"
SITES = ["site-a", "site-b", "site-c"]


class Deployment(Localhost):
    def federate(self, out: Path, **config) -> int:
        return self.run({"model": str(MODEL), "out": str(out), "min-clients": 3, "connect-timeout": 60.0,
                         "round-deadline": 120.0, **config})


@pytest.fixture
def deployment(tmp_path):
    site = Deployment(tmp_path)
    site.superlink()
    time.sleep(3)
    for i, cid in enumerate(SITES):
        calib = tmp_path / f"{cid}.tokens.safetensors"
        save_tokens(calib, torch.randint(0, 257, (3, 16), generator=torch.Generator().manual_seed(i)))
        site.supernode(cid, {"model": str(MODEL), "calib": str(calib), "client-id": cid})
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
    run_id = deployment.federate(tmp_path / "one-shot", **{"format-version": 2})
    run = deployment.wait(run_id, 180)
    assert run["status"] == "finished:completed", run
    assert (tmp_path / "one-shot" / "global.mask.safetensors").read_bytes() == \
        file_protocol(tmp_path / "a", tmp_path, 1, "--format-version", 2).read_bytes()
    assert run["network-traffic"]["inbound-bytes"] > sum(
        p.stat().st_size for p in (tmp_path / "one-shot" / "round-000").glob("site-*.mask.safetensors"))

    # iterative: the SuperLink dies after round 0 and comes back; the federation, started again,
    # resumes at round 1 from the global file the coordinator wrote (the SuperNodes reconnect)
    run_id = deployment.federate(tmp_path / "iterative", mode="iterative")
    record = tmp_path / "iterative" / "federation.json"
    end = time.monotonic() + 120
    while not (record.is_file() and json.loads(record.read_text())["rounds"]):
        assert time.monotonic() < end and deployment.status(run_id)["status"] != "finished:failed", \
            deployment.status(run_id)
        time.sleep(0.5)
    deployment.stop("superlink")
    deployment.superlink()
    time.sleep(3)
    run_id = deployment.federate(tmp_path / "iterative", mode="iterative")
    run = deployment.wait(run_id, 180)
    assert run["status"] == "finished:completed", run["status-details"]
    state = json.loads(record.read_text())
    assert state["status"] == "completed" and state["resumed_at_round"] == [1]
    assert (tmp_path / "iterative" / "global.mask.safetensors").read_bytes() == \
        file_protocol(tmp_path / "b", tmp_path, 2).read_bytes()


def test_a_failed_serverapp_is_reported_failed(deployment, tmp_path):
    """``flwr run`` returns 0 for a ServerApp that raised; ``flwr ls`` says so."""
    run_id = deployment.federate(tmp_path / "bad", model=str(tmp_path / "no-such-model"))
    assert deployment.wait(run_id, 180)["status"] == "finished:failed"
