"""fedlib over Flower, in one process (no SuperLink): the coordinator (flower/fedlib_flower) drives
the real ClientApp through :class:`LocalGrid`, Flower's Grid interface with each node's Context.
Each federation's global file is checked against ``fedlib client-mask`` / ``client-weights`` and
``fedlib aggregate`` run here through the CLI on the same clients' data: byte for byte.
The multi-process run (SuperLink, SuperNodes, ``flwr run``) is ``make test-flower``."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from uuid import uuid4

import pytest
import torch

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from fedlib.cli import main
from fedlib.data import save_tokens
from fedlib.maskfile import MaskFile, pack_bits

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "flower"))  # the app folder `flwr run` ships
from fedlib_flower import client_app, wire  # noqa: E402
from fedlib_flower.coordinator import Coordinator, FederationError  # noqa: E402
from fedlib_flower.roster import load_roster, new_signing_key, write_roster  # noqa: E402
from fedlib_flower.settings import Settings  # noqa: E402

MODEL = REPO / ".test" / "model"
SITES = ["hospital-a", "hospital-b", "hospital-c"]


class LocalGrid:
    """Flower's Grid interface in one process: a pushed message goes to the real ClientApp with its
    node's Context (node config; state kept across messages as a SuperNode keeps it).
    ``tamper(node, message, reply)`` may replace a reply, or return None: no answer, ever;
    ``meddle(node, message)`` may replace what the coordinator sends (an active coordinator).
    ``received`` is every reply the coordinator got (what the server holds; an upload's first
    reply without its chunk once the coordinator wrote it), ``sent`` every
    message as the site got it, ``answered`` each (message, reply) pair. ``ledgers``: the
    folder of the sites' contribution ledgers, ``<client id>.ledger.json`` (default a new one:
    sites that have contributed nothing yet) unless a node config names its own."""

    def __init__(self, sites: dict[str, dict], tamper=None, fail_from: str | None = None, roster: str | None = None,
                 meddle=None, ledgers: Path | None = None):
        import tempfile

        from flwr.supercore.task_identity import TaskIdentity

        # what the ServerApp runtime sets before main(): messages carry the run and the sender
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 0
        self.run = SimpleNamespace(run_id=1)
        #: the coordinator's roster: the sites' own (a test may give another)
        self.roster = roster or next(iter(sites.values()))["roster"]
        ledgers = Path(ledgers or tempfile.mkdtemp(prefix="ledgers-"))
        spools = Path(tempfile.mkdtemp(prefix="spools-"))  # each grid's own: tests may run side by side
        self.contexts = {1000 + i: Context(run_id=1, node_id=1000 + i, state=RecordDict(), run_config={},
                                           node_config={"ledger": str(ledgers / f"{cid}.ledger.json"),
                                                        "spool": str(spools / cid), **config})
                         for i, (cid, config) in enumerate(sites.items())}
        self.tamper, self.fail_from, self.meddle = tamper, fail_from, meddle
        self.inbox: dict[str, Message] = {}
        self.received: list[Message] = []
        self.reply_bytes: list[int] = []  # each reply's payload bytes when the coordinator got it
        self.payloads: list[dict] = []  # each reply's records when the coordinator got it
        self.sent: list[Message] = []
        self.answered: list[tuple[Message, Message]] = []

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            if self.fail_from and message.metadata.group_id == self.fail_from:
                raise ConnectionError("the SuperLink went away")
            message.metadata.__dict__["_message_id"] = uuid4().hex
            self.inbox[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = []
        for message_id in message_ids:
            message = self.inbox.pop(message_id, None)
            if message is None:
                continue
            node = message.metadata.dst_node_id
            if self.meddle is not None:
                message = self.meddle(node, message)
            self.sent.append(message)
            try:
                reply = client_app.app(message, self.contexts[node])
            except Exception as err:  # what a SuperNode returns when its ClientApp fails
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=message)
            if self.tamper is not None:
                reply = self.tamper(node, message, reply)
            if reply is not None:
                if reply.has_content():
                    self.reply_bytes.append(wire.declared_bytes(reply.content))
                    self.payloads.append(dict(reply.content))
                self.received.append(reply)
                self.answered.append((message, reply))
                replies.append(reply)
        return replies


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, dict]:
    """Three sites' node configs over the .test model, each with its own calibration tokens and
    signing key, all with the federation's roster (the coordinator's too: ROSTER)."""
    root = tmp_path_factory.mktemp("sites")
    out, keys = {}, {}
    for i, cid in enumerate(SITES):
        calib = root / f"{cid}.tokens.safetensors"
        save_tokens(calib, torch.randint(0, 257, (3, 16), generator=torch.Generator().manual_seed(i)))
        keys[cid] = new_signing_key(root / f"{cid}.key.pem").public_key()
        out[cid] = {"model": str(MODEL), "calib": str(calib), "signing-key": str(root / f"{cid}.key.pem"),
                    "roster": str(root / "roster.json")}
    write_roster(root / "roster.json", keys)
    return out


def settings(out: Path, roster: str, **kw) -> Settings:
    config = {"model": str(MODEL), "out": str(out), "roster": roster, "min-clients": 3, "connect-timeout": 5.0, **kw}
    return Settings.from_run_config(config)


def federate(grid, out: Path, **kw) -> dict:
    return Coordinator(grid, settings(out, grid.roster, **kw), log=lambda line: None).run()


def roster_of(sites: dict[str, dict]) -> str:
    return next(iter(sites.values()))["roster"]


def cli(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


def cli_client_masks(sites, folder: Path, *extra, names=SITES) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for cid in names:
        paths.append(folder / f"{cid}.mask.safetensors")
        cli("client-mask", "--model", MODEL, "--calib", sites[cid]["calib"], "--client-id", cid, "--out", paths[-1],
            *extra)
    return paths


@pytest.mark.parametrize("group,version,chunk", [("layer", 1, 4 << 20), ("row", 2, 4 << 20), ("column", 1, 4 << 20),
                                                 ("layer", 1, 1024)])
def test_one_shot_equals_the_file_protocol_byte_for_byte(sites, tmp_path, group, version, chunk):
    """Also with uploads pulled in chunks of 1 KiB (several per file): the same files, and no
    reply the coordinator took carried more than a chunk of payload and its small records."""
    grid = LocalGrid(sites)
    state = federate(grid, tmp_path / "fl", group=group, **{"format-version": version, "chunk-bytes": chunk})
    assert state["status"] == "completed" and len(state["rounds"]) == 1 and state["rounds"][0]["absent"] == []
    files = cli_client_masks(sites, tmp_path / "cli", "--format-version", version)
    for path in files:  # each site's upload, as the coordinator wrote it on arrival
        assert (tmp_path / "fl" / "round-000" / path.name).read_bytes() == path.read_bytes()
    cli("aggregate", "--model", MODEL, "--group", group, "--out", tmp_path / "cli.global.safetensors", *files)
    assert (tmp_path / "fl" / "global.mask.safetensors").read_bytes() == \
        (tmp_path / "cli.global.safetensors").read_bytes()
    record = state["rounds"][0]
    assert record["bytes_up"] == sum(p.stat().st_size + 32 for p in files)  # each file and its SHA-256
    chunks = [m for m in grid.sent if m.metadata.message_type == wire.UPLOAD_CHUNK]
    assert len(chunks) == sum(-(-p.stat().st_size // chunk) - 1 for p in files)
    # the largest reply: an upload's first (its first chunk and the file's SHA-256)
    assert max(grid.reply_bytes) == min(chunk, max(p.stat().st_size for p in files)) + 32


def test_iterative_equals_the_file_protocol_round_by_round(sites, tmp_path):
    state = federate(LocalGrid(sites), tmp_path / "fl", mode="iterative", scale=True)
    assert len(state["rounds"]) == 2  # one per block of the .test model
    previous = None
    for t in range(2):
        extra = ["--round", t, "--scale"] + (["--global-masks", previous] if previous else [])
        files = cli_client_masks(sites, tmp_path / f"cli{t}", *extra)
        out = tmp_path / f"cli{t}.global.safetensors"
        cli("aggregate", "--model", MODEL, "--mode", "iterative", "--round", t, "--out", out,
            *(["--previous", previous] if previous else []), *files)
        assert (tmp_path / "fl" / f"round-{t:03d}" / "global.mask.safetensors").read_bytes() == out.read_bytes()
        previous = out
    # round 1 sent every site the global file of round 0
    assert state["rounds"][1]["bytes_down"] >= 3 * (tmp_path / "cli0.global.safetensors").stat().st_size
    assert (tmp_path / "fl" / "global.mask.safetensors").read_bytes() == previous.read_bytes()


def test_fedspallm_equals_the_file_protocol_round_by_round(sites, tmp_path):
    state = federate(LocalGrid(sites), tmp_path / "fl", strategy="fedspallm", rounds=2, resources="0.5 0.5 1.0",
                     sparsity=0.6, **{"local-group": "layer"})
    previous = None
    for t, record in enumerate(state["rounds"]):
        files = []
        for cid in SITES:
            files.append(tmp_path / f"cli{t}" / f"{cid}.weights.safetensors")
            files[-1].parent.mkdir(exist_ok=True)
            cli("client-weights", "--model", MODEL, "--calib", sites[cid]["calib"], "--client-id", cid,
                "--blocks", *record["blocks"][cid], "--round", t, "--sparsity", 0.6, "--out", files[-1],
                *(["--global-weights", previous] if previous else []))
            assert (tmp_path / "fl" / f"round-{t:03d}" / files[-1].name).read_bytes() == files[-1].read_bytes()
        out = tmp_path / f"cli{t}.global.safetensors"
        cli("aggregate", "--model", MODEL, "--strategy", "fedspallm", "--sparsity", 0.6, "--round", t, "--out", out,
            *(["--previous", previous] if previous else []), *files)
        assert (tmp_path / "fl" / f"round-{t:03d}" / "global.weights.safetensors").read_bytes() == out.read_bytes()
        previous = out
    # layer sampling: resources 0.5 give one of the two blocks a round, 1.0 both
    assert [len(state["rounds"][0]["blocks"][cid]) for cid in SITES] == [1, 1, 2]


def _plain_layers(files: list[Path]) -> list[bytes]:
    return [pack_bits(mask).numpy().tobytes() for path in files for mask in MaskFile(path).masks().values()]


def _received_bytes(grid: LocalGrid) -> bytes:
    """Every byte of every reply the coordinator got: arrays' data and config values."""
    chunks = []
    for payload in grid.payloads:
        for record in payload.values():
            for value in record.values():
                if hasattr(value, "data"):
                    chunks.append(value.data)
                elif isinstance(value, bytes):
                    chunks.append(value)
                elif isinstance(value, list):
                    chunks.extend(v for v in value if isinstance(v, bytes))
    return b"\0".join(chunks)


@pytest.mark.parametrize("chunk", [4 << 20, 1024])
def test_secure_aggregation_gives_the_same_global_file_and_the_server_no_mask(sites, tmp_path, chunk):
    grid = LocalGrid(sites)
    state = federate(grid, tmp_path / "fl", secagg=True, **{"chunk-bytes": chunk})
    files = cli_client_masks(sites, tmp_path / "cli")
    cli("aggregate", "--model", MODEL, "--out", tmp_path / "cli.global.safetensors", *files)
    assert (tmp_path / "fl" / "global.mask.safetensors").read_bytes() == \
        (tmp_path / "cli.global.safetensors").read_bytes()
    received = _received_bytes(grid)
    plain = _plain_layers(files)
    assert len(received) > sum(map(len, plain))  # the masked uploads came in ...
    assert not any(layer in received for layer in plain)  # ... and no site's mask, of any layer
    kinds = {reply.metadata.message_type for reply in grid.received}
    assert kinds == {wire.HELLO, wire.SECAGG_KEYS, wire.SECAGG_SHARES, wire.SECAGG_UPLOAD, wire.SECAGG_CONFIRM,
                     wire.SECAGG_REVEAL} | ({wire.UPLOAD_CHUNK} if chunk == 1024 else set())
    assert not list((tmp_path / "fl").rglob("*.mask.safetensors")) == [] and \
        sorted(p.name for p in (tmp_path / "fl").rglob("*.mask.safetensors")) == ["global.mask.safetensors"] * 2
    assert state["rounds"][0]["secagg_threshold"] == 2


def test_secure_aggregation_an_upload_not_laid_out_as_the_rounds_words_is_refused(sites, tmp_path):
    """hospital-b's masked upload with its header altered (its metadata's client id another
    site's, the file's size unchanged): refused by name at the header check, the round goes on
    with the other two (the threshold) and gives their plain aggregate."""
    def relabelled(node, message, reply):
        if message.metadata.message_type == wire.SECAGG_UPLOAD and node == 1001:
            data = wire.file_bytes(reply.content, "chunk").replace(b"hospital-b", b"hospital-a", 1)
            return Message(RecordDict({**reply.content, **_upload_reply(data, reply.content["metrics"],
                                                                        message).content}), reply_to=message)
        return reply

    state = federate(LocalGrid(sites, tamper=relabelled), tmp_path / "fl", secagg=True)
    (refusal,) = state["refused"]
    assert refusal["client_id"] == "hospital-b" and refusal["field"] == "header"
    assert state["rounds"][0]["clients"] == ["hospital-a", "hospital-c"]
    assert not list((tmp_path / "fl").rglob("hospital-b.*"))
    files = cli_client_masks(sites, tmp_path / "cli", names=["hospital-a", "hospital-c"])
    cli("aggregate", "--model", MODEL, "--out", tmp_path / "cli.global.safetensors", *files)
    ours, cli_global = MaskFile(tmp_path / "fl" / "global.mask.safetensors"), MaskFile(tmp_path / "cli.global.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(ours.masks().values(), cli_global.masks().values()))


def test_secure_aggregation_survives_a_dropout(sites, tmp_path):
    """hospital-c vanishes after sharing its keys, before its masked upload: the survivors' sum
    still decodes (its pair masks rebuilt from the survivors' shares) and equals aggregating the
    survivors' files; the global file names the absent site."""
    def vanish(node, message, reply):
        dropped = message.metadata.message_type == wire.SECAGG_UPLOAD and node == 1002
        return None if dropped else reply

    state = federate(LocalGrid(sites, tamper=vanish), tmp_path / "fl", secagg=True, **{"round-deadline": 3.0})
    assert state["rounds"][0]["absent"] == ["hospital-c"]
    files = cli_client_masks(sites, tmp_path / "cli", names=SITES[:2])
    cli("aggregate", "--model", MODEL, "--out", tmp_path / "cli.global.safetensors", *files)
    ours, theirs = MaskFile(tmp_path / "fl" / "global.mask.safetensors"), MaskFile(tmp_path / "cli.global.safetensors")
    assert ours.header.extra["absent_clients"] == '["hospital-c"]' and ours.header.n_clients == 2
    for layer in theirs.header.layers:
        name = layer["name"]
        assert torch.equal(ours.layer_mask(name), theirs.layer_mask(name))
        assert torch.equal(ours.layer_votes(name), theirs.layer_votes(name))


def test_iterative_secure_aggregation_equals_plain_and_sends_sites_no_votes(sites, tmp_path):
    """Iterative FedPrLLM under secure aggregation gives the plain federation's global files, and
    the earlier rounds' file each site gets carries the masks but no vote counts (with 2 sites
    those would be the other's mask); with ``scale`` the sites need them and get them."""
    from safetensors import safe_open

    plain = federate(LocalGrid(sites), tmp_path / "plain", mode="iterative")
    grid = LocalGrid(sites)
    secure = federate(grid, tmp_path / "secure", mode="iterative", secagg=True)
    assert len(plain["rounds"]) == len(secure["rounds"]) == 2
    for t in range(2):
        name = f"round-{t:03d}/global.mask.safetensors"
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "secure" / name).read_bytes()
    kept = MaskFile(tmp_path / "secure" / "round-000" / "global.mask.safetensors")
    assert kept.has_votes()  # the coordinator's own copy keeps them: round 1 continues its counts
    carried = [m for m in grid.sent if "previous" in m.content]
    assert len(carried) == 3
    for message in carried:
        sent = tmp_path / "sent.safetensors"
        sent.write_bytes(wire.file_bytes(message.content, "previous"))
        with safe_open(str(sent), "pt") as handle:
            names = list(handle.keys())
        assert names and not [n for n in names if n.startswith("votes:")]
        for layer in kept.header.layers:
            assert torch.equal(MaskFile(sent).layer_mask(layer["name"]), kept.layer_mask(layer["name"]))
    scaled = LocalGrid(sites)
    federate(scaled, tmp_path / "scaled", mode="iterative", scale=True)
    (first, *_) = [m for m in scaled.sent if "previous" in m.content]
    sent.write_bytes(wire.file_bytes(first.content, "previous"))
    assert MaskFile(sent).has_votes()
    with pytest.raises(ValueError, match="min-clients >= 3"):
        settings(tmp_path / "x", roster_of(sites), mode="iterative", secagg=True, scale=True, **{"min-clients": 2})


def test_secure_aggregation_a_site_refuses_to_be_differenced(sites, tmp_path):
    """Differencing: the same plan summed over all three sites, then over hospital-a and -b
    alone, would give hospital-c's mask as the difference. Each site's ledger (node config
    ``ledger``) holds the first run's plan: a and b refuse to upload it again, so no second sum
    exists. A site with ``min-cohort`` 3 refuses a 2-site round at its first step."""
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    federate(LocalGrid(sites, ledgers=ledgers), tmp_path / "all", secagg=True)
    for cid in SITES:
        (entry,) = json.loads((ledgers / f"{cid}.ledger.json").read_text())["contributions"]
        assert entry["run"] == "1" and entry["dp"] is False and len(entry["plan"]) == 64
    pair = {cid: sites[cid] for cid in SITES[:2]}
    grid = LocalGrid(pair, ledgers=ledgers, roster=roster_of(sites))
    with pytest.raises(FederationError):
        federate(grid, tmp_path / "pair", secagg=True, **{"min-clients": 2, "round-deadline": 3.0})
    for node in (1000, 1001):
        assert "already contributed this plan" in _error_of(grid, node, wire.SECAGG_UPLOAD)
    assert not (tmp_path / "pair" / "global.mask.safetensors").exists()
    # another plan (a new sparsity) is a new mask: contributed once, accepted
    federate(LocalGrid(sites, ledgers=ledgers), tmp_path / "other", secagg=True, sparsity=0.6)
    guarded = {cid: {**sites[cid], "min-cohort": 3} for cid in SITES[:2]}
    grid = LocalGrid(guarded, roster=roster_of(sites))
    with pytest.raises(FederationError):
        federate(grid, tmp_path / "small", secagg=True, **{"min-clients": 2, "round-deadline": 3.0})
    for node in (1000, 1001):
        assert "minimum cohort 3" in _error_of(grid, node, wire.SECAGG_SHARES)


def _secagg_message(node: int, kind: str, content: RecordDict, like: Message) -> Message:
    """A coordinator's message of type ``kind`` to ``node`` in the round of ``like``."""
    message = Message(content, node, kind, group_id=like.metadata.group_id, ttl=like.metadata.ttl)
    message.metadata.__dict__["_message_id"] = like.metadata.message_id
    return message


def _error_of(grid: LocalGrid, node: int, kind: str) -> str:
    (reply,) = [r for m, r in grid.answered if m.metadata.dst_node_id == node and m.metadata.message_type == kind]
    assert reply.has_error()
    return reply.error.reason


def test_secure_aggregation_sites_refuse_a_threshold_below_a_majority(sites, tmp_path):
    """t = 1 would make every share the secret. The coordinator refuses to set it, and a
    coordinator that asks anyway (the key step's message, to the real ClientApp) is refused by
    every site."""
    from fedlib.server.secagg import SecAggError

    with pytest.raises(SecAggError, match="threshold 1: a site accepts only a majority"):
        federate(LocalGrid(sites), tmp_path / "fl", secagg=True, **{"secagg-threshold": 1})

    def lower(node, message):
        if message.metadata.message_type == wire.SECAGG_KEYS:
            content = RecordDict({"plan": message.content["plan"], "secagg": ConfigRecord({"round": 0, "threshold": 1})})
            return _secagg_message(node, wire.SECAGG_KEYS, content, message)
        return message

    grid = LocalGrid(sites, meddle=lower)
    with pytest.raises(FederationError, match="signed keys from 0 sites"):
        federate(grid, tmp_path / "fl2", secagg=True)
    for node in (1000, 1001, 1002):
        assert "threshold 1: a site accepts only a majority of its 3-site roster" in \
            _error_of(grid, node, wire.SECAGG_KEYS)


def test_secure_aggregation_a_substituted_key_is_caught(sites, tmp_path):
    """A key replaced on its way in (hospital-b's reply) fails its signature: not relayed, its
    site named, the round goes on with the others (the file protocol's global file over them).
    A key replaced on its way out (the coordinator's relay to hospital-a) is refused by the site."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from fedlib_flower.roster import raw_public_key

    mine = raw_public_key(X25519PrivateKey.generate().public_key())

    def substitute(node, message, reply):
        if message.metadata.message_type == wire.SECAGG_KEYS and node == 1001:
            keys = dict(reply.content["keys"], **{"share-key": mine})
            return Message(RecordDict({"keys": ConfigRecord(keys)}), reply_to=message)
        return reply

    state = federate(LocalGrid(sites, tamper=substitute), tmp_path / "fl", secagg=True, **{"min-clients": 3})
    record = state["rounds"][0]
    assert record["clients"] == ["hospital-a", "hospital-c"] and list(record["secagg_suspects"]) == ["hospital-b"]
    assert "does not verify against the roster" in record["secagg_suspects"]["hospital-b"]
    files = cli_client_masks(sites, tmp_path / "cli", names=["hospital-a", "hospital-c"])
    cli("aggregate", "--model", MODEL, "--out", tmp_path / "cli.global.safetensors", *files)
    ours, theirs = MaskFile(tmp_path / "fl" / "global.mask.safetensors"), MaskFile(tmp_path / "cli.global.safetensors")
    assert all(torch.equal(ours.layer_votes(layer["name"]), theirs.layer_votes(layer["name"]))
               for layer in theirs.header.layers)

    def relay(node, message):
        if message.metadata.message_type == wire.SECAGG_SHARES and node == 1000:
            keys = dict(message.content["secagg"])
            keys["share-keys"] = [mine] + keys["share-keys"][1:]  # hospital-a is told another key for index 0
            return _secagg_message(node, wire.SECAGG_SHARES, RecordDict({"secagg": ConfigRecord(keys)}), message)
        return message

    grid = LocalGrid(sites, meddle=relay)
    federate(grid, tmp_path / "fl2", secagg=True, **{"round-deadline": 3.0})
    assert "the server relayed other keys as this site's" in _error_of(grid, 1000, wire.SECAGG_SHARES)


def test_secure_aggregation_a_site_reveals_only_for_the_survivor_list_t_sites_signed(sites, tmp_path):
    """The coordinator tells hospital-a that hospital-c dropped out (to get the share of c's
    key from a, while b and c reveal c's seed): a confirms that list alone, so it refuses to
    reveal; the coordinator gets no share of c's key, and the round completes with the others'
    reveals (threshold 2) and every site's votes."""
    confirmed = {}

    def split(node, message):
        kind = message.metadata.message_type
        if node == 1000 and kind in (wire.SECAGG_CONFIRM, wire.SECAGG_REVEAL):
            step = dict(message.content["secagg"], survivors=[0, 1])
            if kind == wire.SECAGG_REVEAL:
                confirmed["signers"] = step["signers"]
            return _secagg_message(node, kind, RecordDict({"secagg": ConfigRecord(step)}), message)
        return message

    grid = LocalGrid(sites, meddle=split)
    state = federate(grid, tmp_path / "fl", secagg=True)
    assert "do not verify" in _error_of(grid, 1000, wire.SECAGG_REVEAL)
    assert confirmed["signers"] == [1, 2]  # a's signature on [0, 1] did not count for [0, 1, 2]
    assert "hospital-a" in state["rounds"][0]["secagg_suspects"]
    reveals = [r for m, r in grid.answered if m.metadata.message_type == wire.SECAGG_REVEAL and not r.has_error()]
    assert all("key" not in r.content["reveal"]["kinds"] for r in reveals)  # no site's key left a site
    assert state["rounds"][0]["clients"] == SITES


def test_secure_aggregation_a_site_uploads_once_a_round(sites, tmp_path):
    """After a round, the coordinator asks hospital-a to upload again under the same secrets,
    for the same plan and for another one (magnitude: its difference with the first upload
    would be a's Wanda mask): refused both times, from the state the site persisted."""
    grid = LocalGrid(sites)
    federate(grid, tmp_path / "fl", secagg=True)
    (upload,) = [m for m in grid.sent if m.metadata.message_type == wire.SECAGG_UPLOAD
                 and m.metadata.dst_node_id == 1000]
    other = RecordDict({**upload.content, "plan": ConfigRecord(dict(upload.content["plan"], method="magnitude"))})
    from fedlib.server.secagg import SecAggError

    for content in (upload.content, other):
        with pytest.raises(SecAggError, match="already received the round's shares"):
            client_app.app(_secagg_message(1000, wire.SECAGG_UPLOAD, content, upload), grid.contexts[1000])


def _empty_coded_layer(data: bytes) -> bytes:
    """A version 2 mask file whose first coded layer is 0 bytes long, laid out canonically."""
    from fedlib.io import safetensors_layout

    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    meta = header.pop("__metadata__")
    body = data[8 + length:]
    chunks = {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()}
    first = sorted(k for k in chunks if k.startswith("mask:"))[0]
    chunks[first] = b""
    head, _ = safetensors_layout({k: (torch.uint8, (len(v),)) for k, v in chunks.items()}, meta, "x")
    return head + b"".join(chunks[k] for k in sorted(chunks))


def _upload_reply(data: bytes, metrics, message: Message) -> Message:
    """An upload step's reply offering ``data`` (whole, in its first chunk) as the site's file."""
    import hashlib

    return Message(RecordDict({"upload": ConfigRecord({"size": len(data), "sha256": hashlib.sha256(data).digest()}),
                               "chunk": wire.file_record(data), "metrics": metrics}), reply_to=message)


def test_a_hostile_upload_is_refused_by_name_and_field_while_the_others_aggregate(sites, tmp_path):
    def hostile(node, message, reply):
        if message.metadata.message_type == wire.TRAIN_MASK and node == 1001:
            bad = _empty_coded_layer(wire.file_bytes(reply.content, "chunk"))
            return _upload_reply(bad, reply.content["metrics"], message)
        return reply

    state = federate(LocalGrid(sites, tamper=hostile), tmp_path / "fl", **{"format-version": 2})
    (refusal,) = state["refused"]
    assert refusal["client_id"] == "hospital-b" and refusal["field"].startswith("mask:model.layers.0.")
    assert refusal["file"].endswith("round-000/hospital-b.mask.safetensors") and "bytes in" in refusal["reason"]
    assert (tmp_path / "fl" / "round-000" / "refused" / "hospital-b.mask.safetensors").is_file()
    files = cli_client_masks(sites, tmp_path / "cli", "--format-version", 2, names=["hospital-a", "hospital-c"])
    cli("aggregate", "--model", MODEL, "--out", tmp_path / "cli.global.safetensors", *files)
    ours = MaskFile(tmp_path / "fl" / "global.mask.safetensors")
    assert ours.header.extra["absent_clients"] == '["hospital-b"]'
    assert ours.masks().keys() == MaskFile(tmp_path / "cli.global.safetensors").masks().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.masks().values(),
                                                 MaskFile(tmp_path / "cli.global.safetensors").masks().values()))


def test_an_upload_under_another_client_id_is_refused(sites, tmp_path):
    """A node that sends a file made for another site (here: hospital-a's own file) is refused."""
    taken = {}

    def impostor(node, message, reply):
        if message.metadata.message_type == wire.TRAIN_MASK:
            if node == 1000:
                taken["a"] = wire.file_bytes(reply.content, "chunk")
            elif node == 1002:
                return _upload_reply(taken["a"], reply.content["metrics"], message)
        return reply

    state = federate(LocalGrid(sites, tamper=impostor), tmp_path / "fl")
    (refusal,) = state["refused"]
    assert refusal["client_id"] == "hospital-c" and refusal["field"] == "client_id"
    assert state["rounds"][0]["clients"] == ["hospital-a", "hospital-b"]


class BusySuperLink(LocalGrid):
    """A SuperLink whose pulls fail with HTTP ``status`` (as Flower's HTTP grid raises it) the first
    ``failures`` times each message is pulled, delivering nothing then."""

    def __init__(self, sites, status: int, failures: int):
        super().__init__(sites)
        self.status, self.failures, self.refused = status, failures, Counter()

    def pull_messages(self, message_ids):
        import httpx

        for message_id in message_ids:
            if message_id in self.inbox and self.refused[message_id] < self.failures:
                self.refused[message_id] += 1
                request = httpx.Request("POST", "http://127.0.0.1/v1/runtime/pull-messages")
                response = httpx.Response(self.status, request=request)
                raise httpx.HTTPStatusError(f"{self.status} for pull-messages", request=request, response=response)
        return super().pull_messages(message_ids)


def test_a_pull_the_superlink_fails_with_a_server_error_is_tried_again(sites, tmp_path, monkeypatch):
    """Each reply's first two pulls answered 500 (the SuperLink's database busy): the round takes
    every reply and gives the undisturbed federation's global file; a 403 still ends the run."""
    from fedlib_flower import coordinator

    monkeypatch.setattr(coordinator, "POLL_SECONDS", 0.001)
    federate(LocalGrid(sites), tmp_path / "calm")
    busy = BusySuperLink(sites, 500, failures=2)
    state = federate(busy, tmp_path / "busy")
    assert state["status"] == "completed" and state["rounds"][0]["absent"] == []
    assert set(busy.refused.values()) == {2} and len(busy.refused) >= 4  # hello and uploads of 3 sites
    assert (tmp_path / "busy" / "global.mask.safetensors").read_bytes() == \
        (tmp_path / "calm" / "global.mask.safetensors").read_bytes()
    with pytest.raises(Exception, match="403"):
        federate(BusySuperLink(sites, 403, failures=1), tmp_path / "refused")


@pytest.mark.parametrize("silent_on", [wire.TRAIN_MASK, wire.UPLOAD_CHUNK])
def test_one_shot_closes_at_the_deadline_with_the_sites_that_answered(sites, tmp_path, silent_on):
    """hospital-a never answers its upload step, or stops halfway through its file (chunks of
    1 KiB): the round closes at its deadline without it, and nothing of its upload is left."""
    def silent(node, message, reply):
        return None if message.metadata.message_type == silent_on and node == 1000 else reply

    state = federate(LocalGrid(sites, tamper=silent), tmp_path / "fl", **{"round-deadline": 2.0, "chunk-bytes": 1024})
    assert state["rounds"][0]["absent"] == ["hospital-a"]
    assert not [p for p in (tmp_path / "fl").rglob("*") if "hospital-a" in p.name]
    files = cli_client_masks(sites, tmp_path / "cli", names=SITES[1:])
    cli("aggregate", "--model", MODEL, "--out", tmp_path / "cli.global.safetensors", *files)
    ours, theirs = MaskFile(tmp_path / "fl" / "global.mask.safetensors"), MaskFile(tmp_path / "cli.global.safetensors")
    assert ours.header.extra["absent_clients"] == '["hospital-a"]' and ours.header.n_clients == 2
    assert all(torch.equal(ours.layer_votes(layer["name"]), theirs.layer_votes(layer["name"]))
               for layer in theirs.header.layers)


def test_a_restart_between_rounds_resumes_from_the_files_on_disk(sites, tmp_path):
    """The SuperLink goes away when round 1 of an iterative federation is pushed; started again
    on the same out folder, the federation continues at round 1 from round 0's global file, and
    ends with the bytes of an uninterrupted run. Other settings on that folder are refused."""
    with pytest.raises(ConnectionError):
        federate(LocalGrid(sites, fail_from="round-1"), tmp_path / "fl", mode="iterative")
    state = json.loads((tmp_path / "fl" / "federation.json").read_text())
    assert len(state["rounds"]) == 1 and state["status"] == "running"
    state = federate(LocalGrid(sites), tmp_path / "fl", mode="iterative")
    assert state["resumed_at_round"] == [1] and len(state["rounds"]) == 2
    federate(LocalGrid(sites), tmp_path / "whole", mode="iterative")
    assert (tmp_path / "fl" / "global.mask.safetensors").read_bytes() == \
        (tmp_path / "whole" / "global.mask.safetensors").read_bytes()
    with pytest.raises(FederationError, match="field 'settings'.*'sparsity'"):
        federate(LocalGrid(sites), tmp_path / "fl", mode="iterative", sparsity=0.6)


def _impostors(sites: dict[str, dict], root: Path) -> dict[str, dict]:
    """The three sites and four nodes that attack ``hello``: a second node with hospital-a's
    key, a node whose key is in no roster, one that claims hospital-b's key with its own
    signature, one that replays hospital-c's hello reply (all with path-free roster ids)."""
    stranger = {**sites["hospital-a"], "signing-key": str(root / "stranger.key.pem")}
    own = load_roster(sites["hospital-a"]["roster"])  # the stranger's own roster names it too
    own["stranger"] = new_signing_key(root / "stranger.key.pem").public_key()
    write_roster(root / "stranger.roster.json", own)
    stranger["roster"] = str(root / "stranger.roster.json")
    return {**sites, "twin": {**sites["hospital-a"]}, "stranger": stranger, "forger": {**stranger},
            "replayer": {**stranger}}


def _forge_and_replay(node, message, reply):
    """Node 1005 claims hospital-b's key; node 1006 sends hospital-c's (node 1002's) reply."""
    if message.metadata.message_type != wire.HELLO:
        return reply
    hello = dict(reply.content["hello"])
    if node == 1005:
        hello["public-key"] = _forge_and_replay.keys["hospital-b"]
    elif node == 1002:
        _forge_and_replay.seen = dict(hello)
    elif node == 1006:
        hello = _forge_and_replay.seen
    return Message(RecordDict({"hello": ConfigRecord(hello)}), reply_to=message)


def test_ids_come_from_the_roster_and_an_impostor_is_refused_alone(sites, tmp_path):
    """Four hostile nodes beside the three sites: a second holder of hospital-a's key, a key no
    roster of the coordinator has, a forged claim of hospital-b's key, a replay of hospital-c's
    signed hello. Each is refused alone and named in federation.json; the three sites keep
    their ids and the global file is the honest federation's, byte for byte."""
    from fedlib_flower.roster import raw_public_key

    _forge_and_replay.keys = {cid: raw_public_key(k) for cid, k in load_roster(roster_of(sites)).items()}
    grid = LocalGrid(_impostors(sites, tmp_path), tamper=_forge_and_replay, roster=roster_of(sites))
    state = federate(grid, tmp_path / "fl")
    assert state["clients"] == SITES and state["rounds"][0]["clients"] == SITES
    refused = {r["client_id"]: (r["field"], r["reason"]) for r in state["refused"]}
    assert sorted(refused) == ["node 1003", "node 1004", "node 1005", "node 1006"]
    assert "'hospital-a' is already held by node 1000" in refused["node 1003"][1]
    assert refused["node 1004"][0] == "public-key" and "is not in the coordinator's roster" in refused["node 1004"][1]
    assert refused["node 1005"][0] == "signature" and "'hospital-b'" in refused["node 1005"][1]
    assert refused["node 1006"][0] == "signature" and "'hospital-c'" in refused["node 1006"][1]
    federate(LocalGrid(sites), tmp_path / "honest")
    assert (tmp_path / "fl" / "global.mask.safetensors").read_bytes() == \
        (tmp_path / "honest" / "global.mask.safetensors").read_bytes()


def test_hello_refuses_another_model(sites, tmp_path):
    other = {cid: {**config, "model": str(Path(sites["hospital-a"]["calib"]).parent / "other")}
             for cid, config in sites.items()}
    from conftest import tiny_llama

    tiny_llama(vocab_size=257, seed=3).save_pretrained(other["hospital-a"]["model"])
    grid = LocalGrid(other)
    coordinator = Coordinator(grid, settings(tmp_path / "fl", grid.roster), log=lambda line: None)
    with pytest.raises(FederationError, match="0 sites admitted"):
        coordinator.hello([1000, 1001, 1002])
    assert {r["field"] for r in coordinator.state["refused"]} == {"fingerprint"}


@pytest.mark.parametrize("entry,field,message", [
    ({"/x/y": "00" * 32}, "/x/y", "expected a client id"),
    ({"../round-000/global": "00" * 32}, "../round-000/global", "expected a client id"),
    ({"a": "00" * 31}, "a", "neither 64 hex digits nor a PEM block"),
    ({"a": 7}, "a", "expected a public key"),
    ({"a": "ab" * 32, "b": "ab" * 32}, "b", "the same public key as 'a'"),
])
def test_a_roster_with_a_path_like_id_or_a_bad_key_is_refused_by_file_and_field(tmp_path, entry, field, message):
    from fedlib_flower.roster import RosterError

    key = new_signing_key(tmp_path / "k.pem").public_key()
    entry = {cid: raw_public_key_hex(key) if value == "ab" * 32 else value for cid, value in entry.items()}
    (tmp_path / "roster.json").write_text(json.dumps(entry))
    with pytest.raises(RosterError, match=message) as err:
        load_roster(tmp_path / "roster.json")
    assert err.value.field == field and err.value.path == str(tmp_path / "roster.json")


def test_a_roster_takes_hex_and_pem_keys_and_a_signing_key_from_openssl_pem(tmp_path):
    """What an operator writes: ``openssl genpkey -algorithm ed25519`` keys, public halves as
    PEM (``openssl pkey -pubout``) or 64 hex digits."""
    from cryptography.hazmat.primitives import serialization

    from fedlib_flower.roster import load_signing_key, raw_public_key

    a, b = new_signing_key(tmp_path / "a.pem"), new_signing_key(tmp_path / "b.pem")
    pem = a.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "roster.json").write_text(json.dumps({"site-b": raw_public_key_hex(b.public_key()),
                                                      "site-a": pem.decode()}))
    roster = load_roster(tmp_path / "roster.json")
    assert list(roster) == ["site-a", "site-b"]
    assert raw_public_key(roster["site-a"]) == raw_public_key(load_signing_key(tmp_path / "a.pem").public_key())
    assert raw_public_key(roster["site-b"]) == raw_public_key(b.public_key())


def raw_public_key_hex(key) -> str:
    from fedlib_flower.roster import raw_public_key

    return raw_public_key(key).hex()


def test_every_upload_path_stays_in_its_round_folder(sites, tmp_path):
    """Whatever an id could be, the coordinator writes only inside the round's folder."""
    grid = LocalGrid(sites)
    coordinator = Coordinator(grid, settings(tmp_path / "fl", grid.roster), log=lambda line: None)
    folder = coordinator.round_dir(0)
    coordinator.clients = {1000: "hospital-a", 1001: "../round-001/x", 1002: "/x/y"}
    assert coordinator.upload_path(1000, folder, "mask") == folder / "hospital-a.mask.safetensors"
    for node in (1001, 1002):
        with pytest.raises(wire.WireError, match="names a file outside"):
            coordinator.upload_path(node, folder, "mask")


def test_an_oversized_reply_is_refused_by_its_declared_size_before_its_payload_is_read(sites, tmp_path,
                                                                                      monkeypatch):
    """hospital-b's reply declares a 2**40-byte chunk (its payload a few bytes), hospital-c's
    manifest a 2**40-byte file (its chunk honest): each is refused by the declaration, the first
    before its payload is read (wire.raw_bytes), the second before any further chunk is asked
    for; nothing of either is written, hospital-a aggregates."""
    from flwr.app import Array, ArrayRecord

    read, raw_bytes = [], wire.raw_bytes
    monkeypatch.setattr(wire, "raw_bytes", lambda record, key, array: read.append(array.shape) or
                        raw_bytes(record, key, array))

    def oversized(node, message, reply):
        if message.metadata.message_type == wire.TRAIN_MASK and node == 1001:
            huge = Array(dtype="uint8", shape=(1 << 40,), stype=wire.FILE_STYPE, data=b"\0" * 8)
            return Message(RecordDict({"upload": reply.content["upload"], "chunk": ArrayRecord(array_dict={
                wire.FILE_KEY: huge}), "metrics": reply.content["metrics"]}), reply_to=message)
        if message.metadata.message_type == wire.TRAIN_MASK and node == 1002:
            manifest = ConfigRecord({**reply.content["upload"], "size": 1 << 40})
            return Message(RecordDict({**reply.content, "upload": manifest}), reply_to=message)
        return reply

    grid = LocalGrid(sites, tamper=oversized)
    state = federate(grid, tmp_path / "fl", **{"chunk-bytes": 1024}, **{"min-clients": 1})
    b, c = state["refused"]
    assert b["client_id"] == "hospital-b" and f"declares {(1 << 40) + 32} payload bytes" in b["reason"]
    assert (1 << 40,) not in read
    assert c["client_id"] == "hospital-c" and c["field"] == "size" and f"{1 << 40} bytes" in c["reason"]
    assert not [m for m in grid.sent if m.metadata.message_type == wire.UPLOAD_CHUNK and m.metadata.dst_node_id != 1000]
    assert not [p for p in (tmp_path / "fl").rglob("*") if "hospital-b" in p.name or "hospital-c" in p.name]
    assert state["rounds"][0]["clients"] == ["hospital-a"]


@pytest.mark.parametrize("tamper", ["flip", "short"])
def test_a_chunk_that_is_not_the_declared_file_is_refused_and_nothing_of_it_kept(sites, tmp_path, tamper):
    """hospital-b's second chunk has one byte flipped (its file then misses the digest it
    declared) or is a byte short of the range asked: refused, no file or part file of it left
    in the round's folder, the others aggregate."""
    def corrupt(node, message, reply):
        if message.metadata.message_type == wire.UPLOAD_CHUNK and node == 1001 \
                and message.content["chunk"]["offset"] == 1024:
            data = bytearray(wire.file_bytes(reply.content, "chunk"))
            data = data[:-1] if tamper == "short" else data[:7] + bytes([data[7] ^ 1]) + data[8:]
            return Message(RecordDict({"chunk": wire.file_record(bytes(data))}), reply_to=message)
        return reply

    state = federate(LocalGrid(sites, tamper=corrupt), tmp_path / "fl", **{"chunk-bytes": 1024})
    (refusal,) = state["refused"]
    assert refusal["client_id"] == "hospital-b"
    assert refusal["field"] == {"flip": "sha256", "short": "file"}[tamper]
    assert not [p for p in (tmp_path / "fl").rglob("*") if "hospital-b" in p.name]
    assert state["rounds"][0]["clients"] == ["hospital-a", "hospital-c"]


@pytest.mark.parametrize("request_,field", [({"kind": "../../roster"}, "kind"), ({"round": -1}, "round"),
                                            ({"round": 7}, "round"), ({"offset": 1 << 40}, "offset"),
                                            ({"offset": -1}, "offset"), ({"length": 1 << 40}, "length"),
                                            ({"length": 0}, "length")])
def test_a_site_serves_only_ranges_of_its_own_latest_upload(sites, tmp_path, request_, field):
    """After a federation, chunk requests naming another kind of file, another round, a range
    outside the upload or a chunk size a site does not serve are refused by field; the honest
    request gives the file's bytes."""
    grid = LocalGrid(sites)
    federate(grid, tmp_path / "fl")
    (upload,) = [m for m in grid.sent if m.metadata.message_type == wire.TRAIN_MASK and m.metadata.dst_node_id == 1000]
    honest = {"round": 0, "kind": "mask", "offset": 0, "length": 1 << 20}
    ask = lambda request: client_app.app(_secagg_message(1000, wire.UPLOAD_CHUNK, RecordDict(
        {"chunk": ConfigRecord(request)}), upload), grid.contexts[1000])
    data = wire.file_bytes(ask(honest).content, "chunk")
    assert data == (tmp_path / "fl" / "round-000" / "hospital-a.mask.safetensors").read_bytes()
    with pytest.raises(wire.WireError, match=f"key {field!r}"):
        ask({**honest, **request_})


@pytest.mark.parametrize("metrics,key", [({"seconds": 1.0}, "peak-rss-mib"),
                                         ({"seconds": float("nan"), "peak-rss-mib": 1.0}, "seconds"),
                                         ({"seconds": 1.0, "peak-rss-mib": -5.0}, "peak-rss-mib"),
                                         ({"seconds": 1.0, "peak-rss-mib": 1.0, "extra": 2.0}, "extra")])
def test_malformed_metrics_refuse_that_reply_not_the_run(sites, tmp_path, metrics, key):
    """A reply whose metrics lack a key or carry a bad value is refused (before its file is
    written); the run completes with the others and records their metrics."""
    from flwr.app import MetricRecord

    def malformed(node, message, reply):
        if message.metadata.message_type == wire.TRAIN_MASK and node == 1002:
            return Message(RecordDict({"upload": reply.content["upload"], "metrics": MetricRecord(metrics)}),
                           reply_to=message)
        return reply

    state = federate(LocalGrid(sites, tamper=malformed), tmp_path / "fl")
    (refusal,) = state["refused"]
    assert refusal["client_id"] == "hospital-c" and f"record 'metrics': key {key!r}" in refusal["reason"]
    record = state["rounds"][0]
    assert state["status"] == "completed" and record["clients"] == ["hospital-a", "hospital-b"]
    assert len(record["client_seconds"]) == 2 and record["client_peak_rss_mib"] > 0
    assert not list((tmp_path / "fl").rglob("hospital-c.*"))


def test_settings_are_checked_by_key():
    with pytest.raises(ValueError, match="key 'roster': give the coordinator's roster file"):
        Settings.from_run_config({"model": "m", "out": "o"})
    with pytest.raises(ValueError, match="unknown key 'sparsty'"):
        Settings.from_run_config({"model": "m", "out": "o", "roster": "r", "sparsty": 0.5})
    with pytest.raises(ValueError, match="key 'secagg'"):
        Settings.from_run_config({"model": "m", "out": "o", "roster": "r", "secagg": True, "strategy": "fedspallm"})
    with pytest.raises(ValueError, match="key 'sparsity': expected float"):
        Settings.from_run_config({"model": "m", "out": "o", "roster": "r", "sparsity": "half"})
    with pytest.raises(wire.WireError, match="record 'plan': key 'blocks'"):
        wire.config(RecordDict({"plan": __import__("flwr.app").app.ConfigRecord({"blocks": ["x"]})}), "plan",
                    {"blocks": (list, int)})


def test_a_spool_another_user_could_read_is_refused(tmp_path):
    """A site's spool must be its own folder, closed to everyone else (the default lies in the
    shared temporary folder, where another user could have made it first)."""
    import os

    from fedlib_flower.transfer import Spool

    assert Spool(tmp_path / "mine").folder.stat().st_mode & 0o777 == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    with pytest.raises(ValueError, match="key 'spool'.*mode 700"):
        Spool(tmp_path / "open")
