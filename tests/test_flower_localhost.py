"""fedlib over a real Flower deployment on localhost (``make test-flower``, marker ``flower``): a
SuperLink and SuperNodes as separate processes on their own free ports, federations submitted
with ``flwr run``: in Flower's *insecure localhost test mode* (no TLS, no node authentication),
and as deployed across sites (docs/explanation/threat-model.md): TLS from a throwaway CA, every
API on 127.0.0.1, SuperNode authentication, the coordinator's roster. ``flwr run`` exits 0 even when the ServerApp failed, so
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
from fedlib_flower.localhost import Localhost, node_auth_key, site_keys  # noqa: E402

pytestmark = pytest.mark.flower
MODEL = REPO / ".test" / "model"
SITES = ["site-a", "site-b", "site-c"]


class Deployment(Localhost):
    roster: Path

    def federate(self, out: Path, **config) -> int:
        return self.run({"model": str(MODEL), "out": str(out), "roster": str(self.roster), "min-clients": 3,
                         "connect-timeout": 60.0, "round-deadline": 120.0, **config})


def calibration(folder: Path, i: int, cid: str) -> Path:
    calib = folder / f"{cid}.tokens.safetensors"
    save_tokens(calib, torch.randint(0, 257, (3, 16), generator=torch.Generator().manual_seed(i)))
    return calib


@pytest.fixture
def deployment(tmp_path):
    site = Deployment(tmp_path)
    site.superlink()
    time.sleep(3)
    site.roster, keys = site_keys(tmp_path / "keys", SITES)
    for i, cid in enumerate(SITES):
        site.supernode(cid, {"model": str(MODEL), "calib": str(calibration(tmp_path, i, cid)),
                             "signing-key": str(keys[cid]), "roster": str(site.roster)})
    yield site
    site.close()


def cli(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


def file_protocol(root: Path, data: Path, rounds: int, *extra, sites=SITES) -> Path:
    """The global file of ``fedlib client-mask`` + ``fedlib aggregate`` on the sites' data."""
    previous = None
    for t in range(rounds):
        files = []
        iterative = ["--round", t, *(["--global-masks", previous] if previous else [])] if rounds > 1 else []
        for cid in sites:
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
    end = time.monotonic() + 600  # a ceiling: a 2-core machine shared with other jobs is slow
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


def test_tls_and_node_authentication_admit_registered_sites_of_the_roster_only(tmp_path):
    """The deployment of docs/explanation/threat-model.md on localhost: TLS (a CA made here), the
    SuperLink's APIs on 127.0.0.1, SuperNode authentication on. Five SuperNodes:

    * site-a, site-b: keys registered (``flwr supernode register``), in the coordinator's roster:
      they federate, and the global file is the file protocol's on their data, byte for byte;
    * site-x: not registered: the SuperLink refuses it, the SuperNode gives up;
    * site-f: registered, but its signing key is in no roster of the coordinator's: refused at
      hello, by name in federation.json;
    * site-p: registered and in the roster, but it pins apps (Flower's ``--trusted-entities``)
      and this app is not signed by its entity: it refuses to run it, and is refused."""
    site = Deployment(tmp_path, tls=True)
    try:
        site.superlink(node_auth=True)
        time.sleep(3)
        site.roster, keys = site_keys(tmp_path / "keys", ["site-a", "site-b", "site-p"])
        own_roster, strangers = site_keys(tmp_path / "strangers", ["site-f"])  # site-f's roster names it
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        entity = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                        serialization.PublicFormat.OpenSSH)
        (tmp_path / "trusted.yaml").write_text(f"fpk_fedlib: '{entity.decode()}'\n")
        for i, cid in enumerate(["site-a", "site-b", "site-f", "site-p", "site-x"]):
            private, public = node_auth_key(tmp_path, cid)
            if cid != "site-x":
                site.register(public)
            config = {"model": str(MODEL), "calib": str(calibration(tmp_path, i, cid)),
                      "signing-key": str(keys.get(cid) or strangers.get(cid) or keys["site-a"]),
                      "roster": str(own_roster if cid == "site-f" else site.roster)}
            site.supernode(cid, config, auth_key=private,
                           trusted_entities=tmp_path / "trusted.yaml" if cid == "site-p" else None)
        end = time.monotonic() + 120
        while sum(n["status"] == "online" for n in site.nodes()) < 4:
            assert time.monotonic() < end, site.nodes()
            time.sleep(1)
        assert site.procs["site-x"].wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in (tmp_path / "site-x.log").read_text()
        assert len(site.nodes()) == 4  # the registered keys only

        run = site.wait(site.federate(tmp_path / "fl", **{"min-clients": 2}), 600)
        assert run["status"] == "finished:completed", run
        state = json.loads((tmp_path / "fl" / "federation.json").read_text())
        assert state["clients"] == ["site-a", "site-b"]
        reasons = sorted(r["reason"] for r in state["refused"])
        assert len(reasons) == 2 and "is not in the coordinator's roster" in reasons[0] \
            and "The FAB could not be verified" in reasons[1], reasons
        assert (tmp_path / "fl" / "global.mask.safetensors").read_bytes() == \
            file_protocol(tmp_path / "cli", tmp_path, 1, sites=["site-a", "site-b"]).read_bytes()
    finally:
        site.close()
