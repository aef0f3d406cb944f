"""The coordinator: fedlib's server strategies driven round by round over a Flower ``Grid``.

A federation: wait for the sites; ``query.hello`` gives each node the client id the roster
(run config ``roster``, :mod:`fedlib_flower.roster`) has for the Ed25519 key it proves it holds,
and checks its model fingerprint; then each round of the strategy (one-shot FedPrLLM: 1;
iterative: one per block; FedSpaLLM: T) goes out and comes back one reply at a time, each pulled
alone and refused by its declared size before fedlib reads its payload (Flower has pulled that
one message whole by then: hence the chunks). An upload comes a chunk at a
time (:mod:`fedlib_flower.transfer`: its declared size checked before the second chunk is asked
for, its digest at the end), written to ``out/round-NNN/<client id>.<kind>.safetensors`` (the
path checked to stay in that folder), so the coordinator holds one chunk of one reply at a time,
whatever the uploads' size; then read there with fedlib's strict reader, layer by layer: a file
that is not exactly what fedlib writes for content the protocol allows, or whose ``client_id``
is not its node's, is refused (moved to ``refused/``, named with its field in
``federation.json``) while the others aggregate; so is a reply whose metrics are malformed.
The round's global file is what ``fedlib aggregate`` writes for the accepted files (the same
function), plus the clients that are absent (no answer by the round's deadline, or refused) in
``x_absent_clients``.

With ``secagg`` the round is the five steps of :mod:`fedlib.server.secagg` (its variant against
an active server) instead; the coordinator then holds masked words only, never a site's mask,
and unmasks the sum of the survivors' votes layer by layer.

Restart: ``out/federation.json`` records every finished round. A federation started again on the
same out folder with the same settings, after a SuperLink restart, a coordinator crash or a
stopped run, continues with the next round from the global file on disk (the sites keep no
state between rounds); other settings are refused rather than overwrite what is there.
"""

from __future__ import annotations

import hashlib
import json
import resource
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict

from fedlib_flower import wire
from fedlib_flower.settings import Settings
from fedlib_flower.transfer import MANIFEST, Download

#: what a site says in ``hello``
HELLO = {"public-key": bytes, "signature": bytes, "fingerprint": str, "fedlib-version": str, "n-samples": int}
#: the most payload bytes a reply that carries no file (hello, keys, shares, reveals) may declare
SMALL_REPLY = 1 << 20
#: Flower keeps an unanswered message this much longer than the round's deadline
TTL_MARGIN = 60.0
POLL_SECONDS = 0.2
#: a pull the SuperLink fails with a server error (HTTP 5xx: its state database was busy while
#: a large upload was written, seen with 16 secure aggregation sites on 2 cores) is tried again
#: this many times, waiting POLL_SECONDS, then twice as long each time
PULL_RETRIES = 5


class FederationError(RuntimeError):
    """A federation that cannot go on (the coordinator's files so far stay on disk)."""


@dataclass
class Refusal:
    client_id: str
    reason: str
    file: str = ""
    field: str = ""

    def as_dict(self) -> dict:
        return {"client_id": self.client_id, "reason": self.reason, "file": self.file, "field": self.field}


@dataclass
class Upload:
    """What an upload step's replies bring: a file of ``kind`` for round ``round_index``, pulled
    into ``folder`` a chunk at a time, of at most ``limit`` bytes."""

    folder: Path
    kind: str
    round_index: int
    limit: int


@dataclass
class Exchange:
    """What one message step moved and who answered (the replies themselves are gone: each was
    handled, its payload written to disk, as it arrived)."""

    answered: list[int] = field(default_factory=list)
    #: node -> its reply's checked ``metrics`` (steps that upload)
    metrics: dict[int, dict] = field(default_factory=dict)
    bytes_down: int = 0
    bytes_up: int = 0
    #: the coordinator's peak resident memory when the step's last reply was taken (before any
    #: aggregation: what taking the replies needed)
    peak_rss_mib: float = 0.0


#: glibc's mallopt parameter: the size from which a buffer gets a mapping of its own
M_MMAP_THRESHOLD = -3


def return_large_buffers(threshold: int = 1 << 20) -> bool:
    """Give every buffer of ``threshold`` bytes and more a mapping of its own, returned to the
    system when it is freed (glibc only; False elsewhere): a setting of the whole process, made
    where the ServerApp starts. By default glibc raises that threshold
    to the size of each such buffer freed, so the next ones of that size (Flower's copies of each
    reply's chunks, pulled by its worker threads) land in heaps that keep their peak: the
    coordinator's resident memory then grows by several chunks' worth however small they are."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return bool(name) and ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, threshold) == 1
    except (OSError, AttributeError):
        return False


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Coordinator:
    """One federation (module docstring) over ``grid`` as ``settings`` say; ``log`` gets one line
    per event (the ServerApp's output)."""

    def __init__(self, grid, settings: Settings, log: Callable[[str], None] = print):
        from fedlib.models import open_model

        self.grid, self.settings, self.log = grid, settings, log
        self.out = settings.out_dir
        self.handle = open_model(settings.model, weights=False)  # fingerprint, layers, checkpoint (v2 reference)
        self.fingerprint, self.layers = self.handle.fingerprint(), self.handle.layers()
        self.n_blocks = self.handle.n_blocks
        self.clients: dict[int, str] = {}  # node id -> client id, in client id order
        self.roster: dict = {}  # client id -> Ed25519 public key (settings.roster, read at hello)
        self.state: dict = {}

    # ------------------------------------------------------------------ messages

    def exchange(self, outgoing: Mapping[int, tuple[str, RecordDict]], on_reply: Callable[[int, Message], None],
                 group: str, limit: int = SMALL_REPLY, metrics: bool = False, upload: Upload | None = None) -> Exchange:
        """Send each node its (message type, content), at most ``max_parallel`` in flight, and
        take the replies one at a time, pulled one by one as they arrive, until all have answered
        or the round's deadline passes. A reply that declares more than ``limit`` payload bytes is
        refused before its payload is read; with ``metrics`` its metrics record is checked first.
        With ``upload`` the replies bring a file, pulled a chunk at a time (each chunk a message
        of at most ``chunk-bytes``; the node keeps its place among the ``max_parallel`` until its
        file is whole). ``on_reply`` then sees the reply (its file, if any, in place; it writes
        what it keeps to disk: no reply outlives its turn). A reply that carries an error, or
        whose handling raises, is refused and logged, not fatal."""
        s = self.settings
        result, queue = Exchange(), list(outgoing.items())
        pending: dict[str, int] = {}
        downloads: dict[int, tuple[Download, Message, dict | None]] = {}
        deadline = time.monotonic() + s.round_deadline

        def push(node: int, kind: str, content: RecordDict) -> None:
            message = Message(content, node, kind, group_id=group, ttl=s.round_deadline + TTL_MARGIN)
            result.bytes_down += wire.declared_bytes(content)
            for message_id in self.grid.push_messages([message]):
                pending[message_id] = node

        parallel = s.max_parallel or len(queue)
        while queue or pending:
            while queue and len(pending) < parallel:
                node, (kind, content) = queue.pop(0)
                push(node, kind, content)
            if time.monotonic() > deadline:
                break
            for message_id in list(pending):  # one reply in memory at a time
                for reply in self.pull(message_id):
                    node = pending.pop(reply.metadata.reply_to_message_id, None)
                    if node is None:
                        continue
                    if upload is None:
                        self.take(node, reply, on_reply, result, limit, metrics)
                    else:
                        ask = self.take_chunk(node, reply, on_reply, result, upload, downloads, metrics)
                        if ask is not None:
                            push(node, wire.UPLOAD_CHUNK, ask)
            time.sleep(POLL_SECONDS if pending else 0)
        for download, _, _ in downloads.values():
            download.abort()
        for node in pending.values():
            self.log(f"{self.clients.get(node, node)}: no answer within the round's deadline ({s.round_deadline} s)")
        for node, _ in queue:
            self.log(f"{self.clients.get(node, node)}: not asked before the round's deadline")
        result.peak_rss_mib = peak_rss_mib()
        return result

    def pull(self, message_id: str) -> list[Message]:
        """The reply to ``message_id`` if it has come. A pull the SuperLink failed with a server
        error is asked again (:data:`PULL_RETRIES`): in the failure seen, its database busy, the
        failed transaction delivered nothing; were a reply lost all the same, its site would count
        as not answering by the round's deadline, like any silent site. Any other error (a refused
        request, the SuperLink gone) ends the run as before."""
        attempt = 0
        while True:
            try:
                return list(self.grid.pull_messages([message_id]))
            except Exception as err:  # Flower's HTTP grid raises httpx.HTTPStatusError
                status = getattr(getattr(err, "response", None), "status_code", None)
                if not isinstance(status, int) or not 500 <= status < 600 or attempt == PULL_RETRIES:
                    raise
                wait = POLL_SECONDS * 2 ** attempt
                self.log(f"pulling a reply: the SuperLink answered {status} ({err}); again in {wait:.1f} s")
                time.sleep(wait)
                attempt += 1

    def take(self, node: int, reply: Message, on_reply: Callable[[int, Message], None], result: Exchange,
             limit: int, metrics: bool) -> None:
        """One reply of :meth:`exchange`: its size, its metrics, then ``on_reply``."""
        if reply.has_error():
            self.refuse(node, f"the site's ClientApp failed: {reply.error.reason}")
            return
        size = wire.declared_bytes(reply.content)
        if size > limit:
            self.refuse(node, f"the reply declares {size} payload bytes, at most {limit} are expected here")
            return
        result.bytes_up += size
        try:
            measured = wire.metrics(reply.content) if metrics else None
            on_reply(node, reply)
        except (wire.WireError, ValueError) as err:  # MaskFileError, SecAggError, RosterError are ValueErrors
            self.refuse(node, str(err), getattr(err, "path", ""), getattr(err, "field", ""))
            return
        result.answered.append(node)
        if measured is not None:
            result.metrics[node] = measured

    def take_chunk(self, node: int, reply: Message, on_reply: Callable[[int, Message], None], result: Exchange,
                   upload: Upload, downloads: dict, metrics: bool) -> RecordDict | None:
        """One reply of an upload step (:meth:`exchange`): the first gives the file's manifest
        (its size checked against ``upload.limit`` before anything more is asked) and first chunk,
        each next one a chunk. Returns the next chunk's request, or None once the file is whole
        (``on_reply`` then sees the first reply, its chunk dropped) or the node refused."""
        chunk = self.settings.chunk_bytes
        size = 0 if reply.has_error() else wire.declared_bytes(reply.content)
        if reply.has_error() or size > chunk + SMALL_REPLY:
            if node in downloads:
                downloads.pop(node)[0].abort()
            self.take(node, reply, on_reply, result, chunk + SMALL_REPLY, False)  # refused by it
            return None
        result.bytes_up += size
        try:
            if node not in downloads:
                measured = wire.metrics(reply.content) if metrics else None
                manifest = wire.config(reply.content, "upload", MANIFEST)
                path = self.upload_path(node, upload.folder, upload.kind)
                downloads[node] = Download(path, manifest, upload.limit, upload.round_index, upload.kind, chunk), \
                    reply, measured
            download, first, measured = downloads[node]
            download.add(reply.content)
            reply.content.pop("chunk")  # on disk now: the first reply is kept without it
            if not download.done:
                return download.request()
            del downloads[node]
            download.finish()
            on_reply(node, first)
        except (wire.WireError, ValueError) as err:
            if node in downloads:
                downloads.pop(node)[0].abort()
            self.refuse(node, str(err), getattr(err, "path", ""), getattr(err, "field", ""))
            return None
        result.answered.append(node)
        if measured is not None:
            result.metrics[node] = measured
        return None

    def refuse(self, node: int, reason: str, file: str = "", field_name: str = "", client_id: str | None = None) -> None:
        refusal = Refusal(client_id or self.clients.get(node, f"node {node}"), reason, file, field_name)
        self.state.setdefault("refused", []).append({"round": self.state.get("round"), **refusal.as_dict()})
        self.log(f"refused {refusal.client_id}: {reason}")
        if file and Path(file).is_file():  # kept for the operator, out of the round's folder
            folder = Path(file).parent / "refused"
            folder.mkdir(exist_ok=True)
            Path(file).replace(folder / Path(file).name)

    # ------------------------------------------------------------------ the federation

    def run(self) -> dict:
        s = self.settings
        self.out.mkdir(parents=True, exist_ok=True)
        nodes = self.wait_for_nodes()
        self.hello(nodes)
        refused = self.state.get("refused", [])  # at hello, before the record is opened
        self.state = self.resume()
        self.state["refused"].extend(refused)
        strategy = s.server(len(self.clients))
        rounds = strategy.n_rounds(self.n_blocks)
        for t in range(len(self.state["rounds"]), rounds):
            self.state["round"] = t
            start, peak_before = time.monotonic(), peak_rss_mib()
            if s.strategy == "fedspallm":
                record = self.fedspallm_round(strategy, t)
            elif s.secagg:
                record = self.secagg_round(strategy, t)
            else:
                record = self.mask_round(strategy, t)
            record.update(round=t, seconds=time.monotonic() - start, coordinator_peak_rss_mib=peak_rss_mib(),
                          coordinator_peak_rss_before_mib=peak_before)
            self.state["rounds"].append(record)
            self.save()
            self.log(f"round {t}: {len(record['clients'])} clients, {record['bytes_up']} bytes up, "
                     f"{record['bytes_down']} down, {record['seconds']:.1f} s")
        final = self.out / self.global_name(rounds - 1)
        shutil.copyfile(self.round_dir(rounds - 1) / final.name, final)
        self.state.update(status="completed", global_file=str(final))
        self.save()
        return self.state

    def wait_for_nodes(self) -> list[int]:
        s = self.settings
        deadline = time.monotonic() + s.connect_timeout
        while True:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= s.min_clients:
                return nodes
            if time.monotonic() > deadline:
                raise FederationError(f"{len(nodes)} sites connected after {s.connect_timeout} s, "
                                      f"min-clients is {s.min_clients}")
            time.sleep(1.0)

    def hello(self, nodes: list[int]) -> None:
        """Give each node its client id: the roster's id of the key it proves it holds (a
        signature over a fresh challenge bound to this run and the node). A node whose key is not
        in the roster, whose signature fails, or whose key another node already proved, is
        refused alone; so is another model."""
        from fedlib_flower.roster import load_roster, raw_public_key, verifies

        self.roster = roster = load_roster(self.settings.roster)
        by_key = {raw_public_key(key): cid for cid, key in roster.items()}
        run_id = self.grid.run.run_id
        challenges = {node: secrets.token_bytes(32) for node in nodes}
        self.clients = {}

        def take(node: int, reply: Message) -> None:
            info = wire.config(reply.content, "hello", HELLO)
            cid = by_key.get(info["public-key"])
            if cid is None:
                raise wire.WireError("hello", "public-key", f"{info['public-key'].hex()} is not in the coordinator's "
                                                            f"roster {self.settings.roster}")
            if not verifies(roster[cid], info["signature"], wire.hello_statement(run_id, node, challenges[node])):
                raise wire.WireError("hello", "signature", f"does not prove {cid!r}'s key for this run and node")
            if info["fingerprint"] != self.fingerprint:
                raise wire.WireError("hello", "fingerprint", f"{info['fingerprint'][:16]}... is another model than "
                                                             f"the coordinator's ({self.fingerprint[:16]}...)")
            holder = next((n for n, c in self.clients.items() if c == cid), None)
            if holder is not None:  # the first to prove the key holds it
                raise wire.WireError("hello", "public-key", f"{cid!r} is already held by node {holder}")
            self.clients[node] = cid

        self.exchange({n: (wire.HELLO, RecordDict({"hello": ConfigRecord({"challenge": challenges[n]})}))
                       for n in nodes}, take, "hello")
        self.clients = dict(sorted(self.clients.items(), key=lambda item: item[1]))
        if len(self.clients) < self.settings.min_clients:
            raise FederationError(f"{len(self.clients)} sites admitted, min-clients is {self.settings.min_clients}")
        self.log(f"sites: {list(self.clients.values())}")

    def resume(self) -> dict:
        """The federation's record: a new one, or the one on disk if it is this federation."""
        path = self.out / "federation.json"
        settings = self.settings.digest_fields()
        digest = hashlib.sha256(json.dumps({**settings, "fingerprint": self.fingerprint},
                                           sort_keys=True).encode()).hexdigest()
        fresh = {"settings": settings, "digest": digest, "model_fingerprint": self.fingerprint,
                 "clients": sorted(self.clients.values()), "rounds": [], "refused": [], "status": "running",
                 "resumed_at_round": []}
        if not path.is_file():
            return fresh
        state = json.loads(path.read_text())
        if state.get("digest") != digest:
            changed = sorted(k for k in settings if state.get("settings", {}).get(k) != settings[k])
            raise FederationError(f"{path}: field 'settings': a federation with other settings ({changed or 'model'}) "
                                  "is there; give another out folder")
        if sorted(self.clients.values()) != state["clients"] and self.settings.strategy == "fedprllm" \
                and self.settings.mode == "iterative" and state["rounds"]:
            raise FederationError(f"{path}: field 'clients': iterative FedPrLLM continues with the same sites "
                                  f"{state['clients']}, connected now: {sorted(self.clients.values())}")
        if state["status"] != "completed":
            state["resumed_at_round"].append(len(state["rounds"]))
            self.log(f"resuming the federation in {self.out} at round {len(state['rounds'])}")
        return state

    def save(self) -> None:
        from fedlib.io import write_text_atomic

        write_text_atomic(self.out / "federation.json", json.dumps(self.state, indent=2, sort_keys=True) + "\n")

    def round_dir(self, t: int) -> Path:
        folder = self.out / f"round-{t:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def global_name(self, t: int) -> str:
        return "global.weights.safetensors" if self.settings.strategy == "fedspallm" else "global.mask.safetensors"

    def previous(self, t: int) -> Path | None:
        """The global file of the round before ``t`` (what round ``t`` continues)."""
        return None if t == 0 else self.round_dir(t - 1) / self.global_name(t - 1)

    def upload_path(self, node: int, folder: Path, kind: str) -> Path:
        """``folder/<client id>.<kind>.safetensors``, refused unless it resolves inside ``folder``
        (the id is a roster name already: this holds whatever a name could be)."""
        path = folder / f"{self.clients[node]}.{kind}.safetensors"
        if path.resolve().parent != folder.resolve():
            raise wire.WireError(kind, "client-id", f"{self.clients[node]!r} names a file outside {folder}")
        return path

    def upload(self, folder: Path, kind: str, t: int) -> Upload:
        """Round ``t``'s ``mask`` / ``weights`` uploads: at most the bytes an honest one of this
        model can have (twice the packed bits: format 2 codes below 1 bit a weight; or float32
        weights and the bits), plus room for the header."""
        numel = sum(info.shape[0] * info.shape[1] for info in self.layers)
        most = {"mask": 2 * (numel // 8 + len(self.layers)), "weights": 4 * numel + numel // 8 + len(self.layers)}
        return Upload(folder, kind, t, most[kind] + SMALL_REPLY)

    def transfer(self) -> ConfigRecord:
        """What an upload step tells the sites of the transfer: the chunk size."""
        return ConfigRecord({"chunk-bytes": self.settings.chunk_bytes})

    def record(self, exchange: Exchange, accepted: list[str], extra: dict | None = None) -> dict:
        """A round's entry in federation.json; the metrics are the uploads' own, checked on arrival."""
        node_of = {cid: node for node, cid in self.clients.items()}
        measured = [exchange.metrics[node_of[cid]] for cid in accepted if node_of[cid] in exchange.metrics]
        absent = sorted(set(self.clients.values()) - set(accepted))
        return {"clients": accepted, "absent": absent, "bytes_up": exchange.bytes_up,
                "bytes_down": exchange.bytes_down, "coordinator_peak_rss_after_replies_mib": exchange.peak_rss_mib,
                "client_peak_rss_mib": max((m["peak-rss-mib"] for m in measured), default=0.0),
                "client_seconds": [m["seconds"] for m in measured], **(extra or {})}

    # ------------------------------------------------------------------ FedPrLLM over files

    def cohort(self) -> dict:
        """What the coordinator told the sites: each file must say it."""
        s = self.settings
        return {"method": s.client_method, "group": s.local_group, "sparsity": s.sparsity}

    def screen(self, strategy, files: dict) -> dict[str, Path]:
        """The paths of the open files (client id -> MaskFile) that pass the cohort check; each
        one that does not is refused by name."""
        from fedlib.maskfile import MaskFileError

        files = dict(files)
        while files:
            try:
                strategy.check_cohort(list(files.values()), self.cohort())
                return {cid: f.path for cid, f in files.items()}
            except MaskFileError as err:
                odd = [cid for cid, f in files.items() if str(f.path) == err.path]
                if not odd:
                    raise
                node = next(n for n, c in self.clients.items() if c == odd[0])
                self.refuse(node, str(err), err.path, err.field)
                del files[odd[0]]
        return files

    def mask_round(self, strategy, t: int) -> dict:
        from fedlib.maskcode import MagnitudeReference
        from fedlib.maskfile import MaskFile, MaskFileError

        s, folder = self.settings, self.round_dir(t)
        settled, current = strategy.round_layers(self.layers, t if s.mode == "iterative" else None)
        reference = MagnitudeReference.of_model(self.handle) if s.format_version == 2 else None
        files = {}

        def take(node: int, reply: Message) -> None:
            path = self.upload_path(node, folder, "mask")
            upload = MaskFile(path, self.fingerprint, current, whole_model=s.mode == "one-shot", reference=reference)
            if upload.header.client_id != self.clients[node]:
                raise MaskFileError(path, "client_id", f"{upload.header.client_id!r}, but the node that sent it "
                                                       f"is {self.clients[node]!r}")
            for info in current:  # every layer's bits against the file's claims, as it arrives
                upload.layer_mask(info.name)
            files[self.clients[node]] = upload

        content = self.plan_content(t)
        content["transfer"] = self.transfer()
        exchange = self.exchange({n: (wire.TRAIN_MASK, content) for n in self.clients}, take, f"round-{t}",
                                 metrics=True, upload=self.upload(folder, "mask", t))
        accepted = self.screen(strategy, files)
        absent = sorted(set(self.clients.values()) - set(accepted))
        if s.mode == "iterative" and absent:
            raise FederationError(f"round {t}: no valid upload from {absent}; iterative FedPrLLM needs every site in "
                                  f"every round: start the federation again to resume at round {t}")
        if not accepted:
            raise FederationError(f"round {t}: no valid upload")
        out = folder / self.global_name(t)
        summary = strategy.aggregate([accepted[c] for c in sorted(accepted)], self.fingerprint, self.layers, out,
                                     round_index=t if s.mode == "iterative" else None, previous=self.previous(t),
                                     cohort=self.cohort(), reference=reference, absent=absent)
        from fedlib.io import write_text_atomic

        write_text_atomic(folder / "global.mask.clients.json",
                          json.dumps({"global": str(out), "strategy": strategy.name, **summary["clients"]},
                                     indent=2, sort_keys=True) + "\n")
        return self.record(exchange, sorted(accepted), {"global_file": str(out)})

    def plan_content(self, t: int, blocks: list[int] | None = None) -> RecordDict:
        plan = self.settings.plan(t)
        if blocks is not None:
            plan["blocks"] = blocks
        content = RecordDict({"plan": ConfigRecord(plan)})
        previous = self.previous(t)
        if previous is not None:
            content["previous"] = wire.file_record(self.previous_for_sites(previous))
        return content

    def previous_for_sites(self, path: Path) -> bytes:
        """What the sites get of the earlier rounds' global file: FedPrLLM's vote counts only
        where the sites scale weights by them (``scale``; with secure aggregation only from 3
        sites up, :meth:`Settings.check`), else the masks alone, so that no site learns how many
        of the others pruned each weight (with 2 sites: the other's mask)."""
        if self.settings.strategy != "fedprllm" or self.settings.scale:
            return path.read_bytes()
        from fedlib.maskfile import write_without_votes

        with tempfile.TemporaryDirectory() as tmp:
            stripped = Path(tmp) / path.name
            write_without_votes(path, stripped)
            return stripped.read_bytes()

    # ------------------------------------------------------------------ FedSpaLLM

    def fedspallm_round(self, strategy, t: int) -> dict:
        from fedlib.maskfile import MaskFileError
        from fedlib.weightfile import open_weight_file

        folder = self.round_dir(t)
        ids = sorted(self.clients.values())
        plan = strategy.configure_round(t, len(ids), self.n_blocks)
        blocks = {cid: list(plan.blocks[i]) for i, cid in enumerate(ids)}
        files = {}

        def take(node: int, reply: Message) -> None:
            cid = self.clients[node]
            path = self.upload_path(node, folder, "weights")
            upload = open_weight_file(path, self.fingerprint, self.layers, blocks[cid])
            if upload.header.client_id != cid:
                raise MaskFileError(path, "client_id", f"{upload.header.client_id!r}, but the node that sent it is {cid!r}")
            if upload.round != t:
                raise MaskFileError(path, "x_round", f"upload for round {upload.round}, this is round {t}")
            for name in upload.layer_names:
                upload.layer_weight(name, upload.layer_mask(name))
            files[cid] = upload

        outgoing = {node: (wire.TRAIN_WEIGHTS, RecordDict({**self.plan_content(t, blocks[cid]), "transfer": self.transfer()}))
                    for node, cid in self.clients.items()}
        exchange = self.exchange(outgoing, take, f"round-{t}", metrics=True, upload=self.upload(folder, "weights", t))
        accepted = self.screen(strategy, files)
        if not accepted:
            raise FederationError(f"round {t}: no valid upload")
        absent = sorted(set(ids) - set(accepted))
        out = folder / self.global_name(t)
        order = sorted(accepted)
        strategy.aggregate([accepted[c] for c in order], self.fingerprint, self.layers, out, previous=self.previous(t),
                           round_index=t, assigned=[blocks[c] for c in order], cohort=self.cohort(), absent=absent)
        return self.record(exchange, order, {"global_file": str(out), "blocks": blocks})

    # ------------------------------------------------------------------ FedPrLLM with secure aggregation

    def secagg_round(self, strategy, t: int) -> dict:
        """The five steps of :mod:`fedlib.server.secagg` (its active-adversary variant) over
        messages. Sites are indexed by their position in the roster; the round is bound to the
        Flower run, the round index, the roster, the plan and the threshold (a majority of the
        roster). The coordinator relays signed keys, ciphertexts and signed survivor
        confirmations, receives masked words (written to disk as they arrive) and the survivors'
        reveals, and unmasks the sum of the votes layer by layer, checked against the cohort's
        group totals; sites the library catches are named in the round's record."""
        from fedlib.io import read_at, safetensors_layout
        from fedlib.server.secagg import (Advertisement, RoundContext, SecAggServer, default_threshold, plan_digest,
                                          unpack_words)
        from fedlib_flower.client_app import ADVERTISEMENT
        from fedlib_flower.roster import secagg_roster
        from fedlib_flower.transfer import words_layout

        s, folder = self.settings, self.round_dir(t)
        group = f"round-{t}"
        roster = secagg_roster(self.roster, self.settings.roster)
        ids = roster.ids
        node_of = {roster.index(cid): node for node, cid in self.clients.items()}
        threshold = s.secagg_threshold or default_threshold(len(roster))
        plan = s.plan(t)
        server = SecAggServer(RoundContext(str(self.grid.run.run_id), t, roster, plan_digest(plan), threshold))
        bits = server.bits
        moved = []

        def step(kind: str, sites, content_of, take, **limits) -> Exchange:
            exchange = self.exchange({node_of[j]: (kind, content_of(j)) for j in sites},
                                     lambda node, reply: take(roster.index(self.clients[node]), reply), group, **limits)
            moved.append(exchange)
            return exchange

        def enough(what: str, have) -> None:
            if len(have) < threshold:
                raise FederationError(f"round {t}: {what} from {len(have)} sites, the threshold is {threshold} "
                                      f"(suspects: {server.suspects or 'none'})")

        adverts: dict[int, Advertisement] = {}

        def take_keys(j: int, reply: Message) -> None:
            keys = wire.config(reply.content, "keys", {"index": int, **ADVERTISEMENT})
            if keys["index"] != j:
                raise wire.WireError("keys", "index", f"{keys['index']}, the roster's index of {ids[j]!r} is {j}")
            adverts[j] = Advertisement(*(keys[k] for k in ADVERTISEMENT))

        step(wire.SECAGG_KEYS, sorted(node_of), lambda j: RecordDict({
            "plan": ConfigRecord(plan), "secagg": ConfigRecord({"round": t, "threshold": threshold})}), take_keys)
        advertised = server.admit(adverts)  # a key whose signature fails is not relayed
        enough("signed keys", advertised)
        order = sorted(advertised)
        keys = ConfigRecord({"round": t, "clients": order, **{
            f"{k}s": [getattr(advertised[j], k.replace("-", "_")) for j in order] for k in ADVERTISEMENT}})
        inbox: dict[int, dict[int, bytes]] = {j: {} for j in order}

        def take_shares(j: int, reply: Message) -> None:
            shares = wire.config(reply.content, "shares", {"recipients": (list, int), "ciphertexts": (list, bytes)})
            if shares["recipients"] != order or len(shares["ciphertexts"]) != len(order):
                raise wire.WireError("shares", "recipients", f"expected one share for each of {order}")
            for r, data in zip(order, shares["ciphertexts"]):
                inbox[r][j] = data

        step(wire.SECAGG_SHARES, order, lambda j: RecordDict({"secagg": keys}), take_shares)
        shared = sorted({sender for box in inbox.values() for sender in box})
        enough("shares", shared)
        numel = {info.name: info.shape[0] * info.shape[1] for info in self.layers}
        uploads: dict[int, Path] = {}
        claims: dict[int, dict] = {}
        complaints: dict[int, list[int]] = {}
        settled, current = strategy.round_layers(self.layers, t if s.mode == "iterative" else None)
        layout = {node: safetensors_layout(*words_layout({info.name: numel[info.name] for info in current}, bits,
                                                         self.clients[node]), "masked words")
                  for node in self.clients}

        def take_masked(j: int, reply: Message) -> None:
            node = node_of[j]
            claim = wire.config(reply.content, "cohort", {"client-id": str, "method": str, "group": str,
                                                          "sparsity": float, "allocation": str, "n-samples": int})
            if claim["client-id"] != self.clients[node]:
                raise wire.WireError("cohort", "client-id", f"{claim['client-id']!r}, the node is {self.clients[node]!r}")
            expected = self.cohort()
            odd = [k for k in expected if claim[k] != expected[k]]
            if odd:
                raise wire.WireError("cohort", odd[0], f"{claim[odd[0]]!r}, the coordinator asked for {expected[odd[0]]!r}")
            accused = wire.config(reply.content, "complaints", {"senders": (list, int)})["senders"]
            # the k-bit words of every layer of the round (transfer.words_layout): the file's size
            # was checked to be exactly this before its chunks were pulled, its header is checked here
            path = self.upload_path(node, folder, "secagg")
            head, _ = layout[node]
            if read_at(path, 0, len(head)) != head or path.stat().st_size != words_size(node):
                path.unlink()
                raise wire.WireError("upload", "header", f"not the layout of {bits}-bit words of the round's "
                                                         f"layers for {self.clients[node]!r}")
            uploads[j], claims[j], complaints[j] = path, claim, accused

        def words_size(node: int) -> int:
            head, spans = layout[node]
            return len(head) + sum(nbytes for _, nbytes in spans.values())

        content = self.plan_content(t)
        step(wire.SECAGG_UPLOAD, shared, lambda j: RecordDict({
            **content, "transfer": self.transfer(), "secagg": ConfigRecord({"round": t, "participants": shared, "senders": sorted(inbox[j]),
                                               "ciphertexts": [inbox[j][i] for i in sorted(inbox[j])]})}),
             take_masked, metrics=True, upload=Upload(folder, "secagg", t, max(map(words_size, self.clients))))
        # a site whose shares another says do not decrypt leaves the sum (both are named)
        survivors = server.drop_accused(uploads, complaints)
        enough("masked uploads", survivors)
        signatures: dict[int, bytes] = {}

        def take_confirm(j: int, reply: Message) -> None:
            signatures[j] = wire.config(reply.content, "confirm", {"signature": bytes})["signature"]

        step(wire.SECAGG_CONFIRM, survivors,
             lambda j: RecordDict({"secagg": ConfigRecord({"round": t, "survivors": survivors})}), take_confirm)
        confirmations = server.admit_confirmations(survivors, signatures)
        enough("signed confirmations", confirmations)
        signers = sorted(confirmations)
        reveals: dict[int, dict] = {}

        def take_reveal(j: int, reply: Message) -> None:
            r = wire.config(reply.content, "reveal", {"owners": (list, int), "kinds": (list, str), "values": (list, bytes)})
            if not len(r["owners"]) == len(r["kinds"]) == len(r["values"]):
                raise wire.WireError("reveal", "owners", "expected one kind and one value for each owner")
            reveals[j] = {o: (k, (j + 1, int.from_bytes(v, "little")))
                          for o, k, v in zip(r["owners"], r["kinds"], r["values"])}

        step(wire.SECAGG_REVEAL, survivors, lambda j: RecordDict({"secagg": ConfigRecord({
            "round": t, "survivors": survivors, "signers": signers,
            "signatures": [confirmations[i] for i in signers]})}), take_reveal)
        enough("reveals", reveals)
        server.recover(reveals, survivors, shared)
        cohort = {**self.cohort(), "allocation": claims[survivors[0]]["allocation"]}
        if any(claims[j]["allocation"] != cohort["allocation"] for j in survivors):
            raise FederationError(f"round {t}: the survivors claim different allocations")
        # each survivor's words of one layer at a time, read where the writer put them (pread, not
        # a mapping of every upload: memory holds one layer of each survivor)
        def words_of(j: int, name: str) -> bytearray:
            head, spans = layout[node_of[j]]
            offset, nbytes = spans[name]
            data = read_at(uploads[j], len(head) + offset, nbytes)
            if len(data) != nbytes:
                raise FederationError(f"{uploads[j]}: {name}: {len(data)} of {nbytes} bytes (the file changed)")
            return data

        def vote(info, layer) -> None:
            masked = {j: unpack_words(words_of(j, info.name), numel[info.name], bits) for j in survivors}
            layer.add_counts(server.unmask(info.name, masked, info.shape, cohort))

        previous = self.previous(t)
        earlier = strategy.open_previous(previous, self.fingerprint, settled, len(survivors), cohort,
                                         t if s.mode == "iterative" else None)
        accepted = [ids[j] for j in survivors]
        absent = sorted(set(self.clients.values()) - set(accepted))
        if s.mode == "iterative" and absent:
            raise FederationError(f"round {t}: {absent} dropped out; iterative FedPrLLM needs every site in every "
                                  f"round: start the federation again to resume at round {t}")
        out = folder / self.global_name(t)
        strategy.write_round(out, self.fingerprint, settled, current, earlier, cohort, len(survivors),
                             sum(claims[j]["n-samples"] for j in survivors), {}, vote, absent)
        total = Exchange(metrics=moved[2].metrics, bytes_down=sum(e.bytes_down for e in moved),
                         bytes_up=sum(e.bytes_up for e in moved), peak_rss_mib=max(e.peak_rss_mib for e in moved))
        return self.record(total, accepted, {"global_file": str(out), "secagg_threshold": threshold,
                                             "secagg_suspects": server.suspects})
