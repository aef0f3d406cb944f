"""A Flower deployment on this machine: for ``make test-flower`` and ``benchmarks/bench_flower.py``.

A SuperLink (state in a database, so SuperNodes stay registered across its restart) and
SuperNodes on free loopback ports, each a process group of its own, logs under ``root``;
``flwr`` talks to it through the connection :data:`CONNECTION` in a private ``FLWR_HOME``.
Either in Flower's *insecure* mode (no TLS, no node authentication: a test and benchmark
shortcut, never across sites) or, with ``tls=True``, as docs/explanation/threat-model.md deploys it: TLS
from a throwaway CA made here (:func:`make_tls`), every API bound to 127.0.0.1, and with
``node_auth`` SuperNode authentication (a SuperNode joins only with a key registered through
the Control API, :meth:`Localhost.register`). Each site's fedlib identity (its Ed25519 signing key
and the federation's roster) comes from :func:`site_keys`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CONNECTION = "localhost-test"
#: the app folder ``flwr run`` ships
APP = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_keys(folder: Path, ids: list[str]) -> tuple[Path, dict[str, Path]]:
    """Sites ``ids``: each one's fedlib signing key, and the roster of all of them (which the
    coordinator and every site hold): (roster, id -> key file)."""
    from fedlib_flower.roster import new_signing_key, write_roster

    folder.mkdir(parents=True, exist_ok=True)
    keys = {cid: folder / f"{cid}.signing-key.pem" for cid in ids}
    write_roster(folder / "roster.json", {cid: new_signing_key(path).public_key() for cid, path in keys.items()})
    return folder / "roster.json", keys


def node_auth_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's Flower authentication key pair (EC P-384, OpenSSH format, what
    ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register`` take)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / f"{name}.auth", folder / f"{name}.auth.pub"
    private.touch(mode=0o600)
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


def make_tls(folder: Path) -> dict[str, Path]:
    """A throwaway CA and the SuperLink's certificate it signs, for 127.0.0.1 and localhost:
    ``ca``, ``cert``, ``key`` (PEM files)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def certificate(subject: str, key, issuer: str, signer, extensions) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - day).not_valid_after(now + day))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("fedlib test CA", ca_key, "fedlib test CA", ca_key,
                     [(x509.BasicConstraints(ca=True, path_length=0), True)])
    server = certificate("localhost", server_key, "fedlib test CA", ca_key, [
        (x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
         False),
        (x509.BasicConstraints(ca=False, path_length=None), True)])
    paths = {"ca": folder / "ca.pem", "cert": folder / "superlink.pem", "key": folder / "superlink.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].touch(mode=0o600)
    paths["key"].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    return paths


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"process {pid}: no VmHWM in /proc/{pid}/status")


class Localhost:
    """The processes of one localhost deployment (module docstring)."""

    def __init__(self, root: Path, tls: bool = False):
        self.root, self.procs = Path(root), {}
        self.port = free_port()
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                    "FLWR_HOME": str(self.root / "flwr")}
        (self.root / "flwr").mkdir(parents=True, exist_ok=True)
        self.tls = make_tls(self.root / "tls") if tls else None
        security = f'root-certificates = "{self.tls["ca"]}"\n' if tls else "insecure = true\n"
        (self.root / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\n{security}')

    def start(self, name: str, *argv) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([str(BIN / str(argv[0])), *map(str, argv[1:])], env=self.env,
                                                cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def superlink(self, node_auth: bool = False) -> None:
        """The SuperLink; with ``node_auth``, only registered SuperNodes may connect."""
        security = (["--ssl-ca-certfile", self.tls["ca"], "--ssl-certfile", self.tls["cert"], "--ssl-keyfile",
                     self.tls["key"]] if self.tls else ["--insecure"]) + (["--enable-supernode-auth"] if node_auth else [])
        self.start("superlink", "flower-superlink", *security, "--disable-runtime-dependency-installation",
                   "--host", "127.0.0.1", "--port", self.port, "--database", self.root / "superlink.db")
        end = time.monotonic() + 120
        while True:  # until its port takes connections
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > end or self.procs["superlink"].poll() is not None:
                    raise RuntimeError(f"the SuperLink did not start: {self.root / 'superlink.log'}") from None
                time.sleep(0.5)

    def supernode(self, name: str, node_config: dict, auth_key: Path | None = None,
                  trusted_entities: Path | None = None) -> None:
        """A site's SuperNode; ``auth_key``: its Flower authentication key (:func:`node_auth_key`);
        ``trusted_entities``: it runs only apps signed by these (Flower's app pinning)."""
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
        security = ["--root-certificates", self.tls["ca"]] if self.tls else ["--insecure"]
        if auth_key is not None:
            security += ["--auth-supernode-private-key", auth_key]
        if trusted_entities is not None:
            security += ["--trusted-entities", trusted_entities]
        self.start(name, "flower-supernode", *security, "--superlink", f"127.0.0.1:{self.port}",
                   "--port", free_port(), "--node-config", config)

    def register(self, public_key: Path) -> None:
        """Register a SuperNode's authentication key (``flwr supernode register``, Control API)."""
        self.flwr("supernode", "register", public_key, CONNECTION)

    def nodes(self) -> list[dict]:
        """``flwr supernode ls``: the registered SuperNodes and their status."""
        return json.loads(self.flwr("supernode", "ls", CONNECTION, "--format", "json"))["nodes"]

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its group: the SuperExec and app processes it started
        except ProcessLookupError:  # it exited by itself, and whatever it started with it
            pass
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
