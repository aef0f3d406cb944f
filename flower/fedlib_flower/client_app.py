"""A site's ClientApp: its handlers call fedlib's library on the site's own model and tokens.

The site's SuperNode names them in its node config (``--node-config``): ``model`` (the public
model's folder), ``calib`` (its private calibration token file, ``fedlib client-data`` /
``calibration-pool``), ``signing-key`` (its Ed25519 private key, PEM) and ``roster`` (the
federation's sites and their public keys, :mod:`fedlib_flower.roster`: the site's client id is
the roster's name for its own key), optionally ``threads`` (torch threads, default 1). Under
secure aggregation also ``ledger`` (a JSON file of the site's own: every plan it contributed, by
run, :class:`fedlib.server.secagg.ContributionLedger`; it refuses to contribute the same plan
twice, which two sums over cohorts that differ by this site would give away) and optionally
``min-cohort`` (the fewest sites it takes part with, itself included; default: the threshold, a
majority of its roster). Nothing else of the site leaves it but the uploads below; the
secure-aggregation secrets stay in the SuperNode's ``context.state``.

* ``query.hello``: its public key and a signature over the coordinator's challenge bound to the
  run and node (the coordinator gives it the id its own roster has for that key), the model
  fingerprint, fedlib version, number of samples;
* ``train.mask``: the site's mask file (one-shot, or round ``l`` of iterative FedPrLLM from the
  server's global file of blocks < l), written by :func:`fedlib.uploads.write_client_mask`;
* ``train.weights``: its FedSpaLLM weight file (:func:`fedlib.uploads.write_client_weights`);
* ``train.secagg_keys`` / ``_shares`` / ``_upload`` / ``_confirm`` / ``_reveal``: the five steps
  of :mod:`fedlib.server.secagg` against an active server; the upload is the mask file's
  layers, masked (a file of k-bit words).
* ``query.upload_chunk``: the next range of the site's latest upload. An upload step answers
  with the file's size, digest and first chunk only; the file waits in the site's spool (node
  config ``spool``, :mod:`fedlib_flower.transfer`) and the coordinator pulls the rest.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedlib_flower import wire
from fedlib_flower.settings import PLAN

app = ClientApp()

#: the node config keys a site gives its SuperNode
NODE_KEYS = {"model", "calib", "signing-key", "roster"}


class Site:
    """The site's model handle (``weights=False``: its fingerprint and layers only), tokens,
    signing key, roster and id, from its node config."""

    def __init__(self, context: Context, weights: bool = True):
        import torch

        from fedlib.data import load_tokens
        from fedlib.models import open_model
        from fedlib_flower.roster import load_roster, load_signing_key, raw_public_key

        config = context.node_config
        missing = sorted(NODE_KEYS - set(config))
        if missing:
            raise ValueError(f"node config: key {missing[0]!r} missing; a site gives {sorted(NODE_KEYS)} "
                             "(flower-supernode --node-config)")
        torch.set_num_threads(int(config.get("threads", 1)))
        self.signing_key = load_signing_key(str(config["signing-key"]))
        self.roster = load_roster(str(config["roster"]))
        self.public_key = raw_public_key(self.signing_key.public_key())
        mine = [cid for cid, key in self.roster.items() if raw_public_key(key) == self.public_key]
        if not mine:
            raise ValueError(f"{config['roster']}: this site's public key {self.public_key.hex()} "
                             f"({config['signing-key']}) is not in its roster")
        self.client_id = mine[0]
        self.handle = open_model(str(config["model"]), weights=weights)
        self.calib = Path(str(config["calib"]))
        self.ids = load_tokens(self.calib)[0]
        self.ledger = str(config.get("ledger", ""))
        self.min_cohort = config.get("min-cohort", 0)
        if type(self.min_cohort) is not int or self.min_cohort < 0:
            raise ValueError(f"node config: key 'min-cohort': expected a whole number >= 0, got {self.min_cohort!r}")

    def contribution(self, plan: dict) -> bytes:
        """The digest of what decides this site's mask under ``plan``: the plan but its file
        encoding, the model and the site's calibration tokens (what its ledger records)."""
        import hashlib

        from fedlib.server.secagg import plan_digest

        decides = {k: v for k, v in plan.items() if k != "format-version"}
        return plan_digest({**decides, "model": self.handle.fingerprint(),
                            "calib-sha256": hashlib.sha256(self.calib.read_bytes()).hexdigest()})


def _metrics(start: float) -> MetricRecord:
    # ru_maxrss is in KiB on Linux: this ClientApp process's peak
    return MetricRecord({"seconds": time.perf_counter() - start,
                         "peak-rss-mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def _previous(message: Message, folder: Path) -> Path | None:
    """The server's global file of the earlier rounds, if the message carries one."""
    if "previous" not in message.content:
        return None
    path = folder / "previous.safetensors"
    path.write_bytes(wire.file_bytes(message.content, "previous"))
    return path


def _pruning(plan: dict):
    """How the plan asks this site to prune (:class:`fedlib.client.Pruning`, on the CPU)."""
    from fedlib.client import Pruning

    return Pruning(plan["method"], plan["sparsity"], plan["group"], plan["seed"], json.loads(plan["method-options"]),
                   plan["batch-size"])


def _offer(context: Context, site: Site, message: Message, path: Path, kind: str, round_index: int,
           **records) -> Message:
    """The upload step's reply: ``path`` kept in the site's spool, its manifest and first chunk
    (the chunk size the coordinator asks for, within what a site serves), and ``records``."""
    from fedlib_flower.transfer import TRANSFER, Spool, check_chunk

    chunk = check_chunk("transfer", "chunk-bytes", wire.config(message.content, "transfer", TRANSFER)["chunk-bytes"])
    content = Spool.of_site(context.node_config, site.public_key).offer(path, message.metadata.run_id, round_index,
                                                                        kind, chunk)
    for name, record in records.items():
        content[name] = record
    return Message(content, reply_to=message)


def _mask_file(site: Site, message: Message, folder: Path) -> Path:
    """This site's mask file for the plan in ``message`` (what ``fedlib client-mask`` writes)."""
    from fedlib.uploads import write_client_mask

    plan = wire.config(message.content, "plan", PLAN)
    out = folder / "upload.safetensors"
    write_client_mask(site.handle, site.ids, out, _pruning(plan), client_id=site.client_id,
                      format_version=plan["format-version"],
                      round_index=None if plan["mode"] == "one-shot" else plan["round"],
                      global_masks=_previous(message, folder), scale=plan["scale"])
    return out


@app.query("hello")
def hello(message: Message, context: Context) -> Message:
    from fedlib import __version__

    site = Site(context, weights=False)
    challenge = wire.config(message.content, "hello", {"challenge": bytes})["challenge"]
    statement = wire.hello_statement(message.metadata.run_id, context.node_id, challenge)
    return Message(RecordDict({"hello": ConfigRecord({
        "public-key": site.public_key, "signature": site.signing_key.sign(statement),
        "fingerprint": site.handle.fingerprint(), "fedlib-version": __version__,
        "n-samples": int(site.ids.shape[0])})}), reply_to=message)


@app.train("mask")
def train_mask(message: Message, context: Context) -> Message:
    start = time.perf_counter()
    site = Site(context)
    round_index = wire.config(message.content, "plan", PLAN)["round"]
    with tempfile.TemporaryDirectory() as tmp:
        return _offer(context, site, message, _mask_file(site, message, Path(tmp)), "mask", round_index,
                      metrics=_metrics(start))


@app.train("weights")
def train_weights(message: Message, context: Context) -> Message:
    from fedlib.uploads import write_client_weights

    start = time.perf_counter()
    site = Site(context)
    plan = wire.config(message.content, "plan", {**PLAN, "blocks": (list, int)})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "upload.safetensors"
        write_client_weights(site.handle, site.ids, out, _pruning(plan), blocks=plan["blocks"],
                             client_id=site.client_id, round_index=plan["round"], weight_dtype=plan["weight-dtype"],
                             global_weights=_previous(message, Path(tmp)))
        return _offer(context, site, message, out, "weights", plan["round"], metrics=_metrics(start))


@app.query("upload_chunk")
def upload_chunk(message: Message, context: Context) -> Message:
    """A range of this site's latest upload (its spool; nothing else of the site can be named)."""
    from fedlib_flower.roster import load_signing_key, raw_public_key
    from fedlib_flower.transfer import REQUEST, Spool

    request = wire.config(message.content, "chunk", REQUEST)
    key = raw_public_key(load_signing_key(str(context.node_config["signing-key"])).public_key())
    data = Spool.of_site(context.node_config, key).chunk(message.metadata.run_id, request)
    return Message(RecordDict({"chunk": wire.file_record(data)}), reply_to=message)


# --------------------------------------------------------------------------- secure aggregation
# The active-adversary variant of :mod:`fedlib.server.secagg`: the site's signing key and roster
# (node config) sign and check every key, the Flower run id and the round index bind them, and
# the site's state of the round (``SecAggClient.to_record``, in its SuperNode's ``context.state``,
# never sent) is written before every reply, so each step happens at most once.


def _secagg_state(context: Context, site: Site, message: Message, round_index: int):
    from fedlib.server.secagg import SecAggClient, SecAggError

    record = context.state["secagg"] if "secagg" in context.state else None
    run_id = str(message.metadata.run_id)
    if record is None or (record["run_id"], record["round_index"]) != (run_id, round_index):
        raise SecAggError(f"run {run_id}, round {round_index}: this site holds no secure-aggregation keys of that round")
    return SecAggClient.from_record(dict(record), site.signing_key)


def _keep_secagg_state(context: Context, client) -> None:
    context.state["secagg"] = ConfigRecord(client.to_record())


#: the signed advertisement of a site's keys (:class:`fedlib.server.secagg.Advertisement`), as it travels
ADVERTISEMENT = {"share-key": bytes, "masking-key": bytes, "seed-commitment": bytes, "signature": bytes}


@app.train("secagg_keys")
def secagg_keys(message: Message, context: Context) -> Message:
    """Step 1: fresh secrets for this round, bound to the run, the round, this site's roster, the
    plan and the threshold (a threshold below a majority of the roster is refused); the public
    halves go out signed. Once per round."""
    from fedlib.server.secagg import RoundContext, SecAggClient, SecAggError, plan_digest
    from fedlib_flower.roster import secagg_roster

    site = Site(context, weights=False)
    if not site.ledger:
        raise ValueError("node config: key 'ledger' missing; under secure aggregation a site records the plans it "
                         "contributed (a JSON file of its own) and refuses the same plan twice")
    step = wire.config(message.content, "secagg", {"round": int, "threshold": int})
    plan = wire.config(message.content, "plan", PLAN)
    run_id = str(message.metadata.run_id)
    held = context.state["secagg"] if "secagg" in context.state else None
    if held is not None and (held["run_id"], held["round_index"]) == (run_id, step["round"]):
        raise SecAggError(f"run {run_id}, round {step['round']}: this site already advertised its keys of this round")
    roster = secagg_roster(site.roster, "the site's roster")
    round_context = RoundContext(run_id, step["round"], roster, plan_digest(plan), step["threshold"])
    client = SecAggClient.create(round_context, site.client_id, site.signing_key, min_cohort=site.min_cohort)
    _keep_secagg_state(context, client)
    advert = client.advertise()
    return Message(RecordDict({"keys": ConfigRecord({
        "index": client.index, "share-key": advert.share_key, "masking-key": advert.masking_key,
        "seed-commitment": advert.seed_commitment, "signature": advert.signature})}), reply_to=message)


@app.train("secagg_shares")
def secagg_shares(message: Message, context: Context) -> Message:
    """Step 2: every relayed key checked against this site's roster, then Shamir shares of its
    secrets, one ciphertext per site (relayed by the server). Once per round."""
    from fedlib.server.secagg import Advertisement

    site = Site(context, weights=False)
    step = wire.config(message.content, "secagg", {"round": int, "clients": (list, int),
                                                   **{f"{k}s": (list, bytes) for k in ADVERTISEMENT}})
    if any(len(step[f"{k}s"]) != len(step["clients"]) for k in ADVERTISEMENT):
        raise wire.WireError("secagg", "clients", "expected one key of each kind for each site")
    client = _secagg_state(context, site, message, step["round"])
    advertised = {j: Advertisement(*(step[f"{k}s"][i] for k in ADVERTISEMENT)) for i, j in enumerate(step["clients"])}
    outbox = client.share_secrets(advertised)
    _keep_secagg_state(context, client)
    recipients = sorted(outbox)
    return Message(RecordDict({"shares": ConfigRecord({"recipients": recipients,
                                                       "ciphertexts": [outbox[j] for j in recipients]})}),
                   reply_to=message)


@app.train("secagg_upload")
def secagg_upload(message: Message, context: Context) -> Message:
    """Step 3: take the shares sent to this site (naming the senders whose shares do not
    decrypt), open the round's one upload for the plan signed at step 1, record it in the site's
    ledger (refused if this site contributed the same plan before, in any run), compute its mask
    file and upload each layer masked (k-bit words, :func:`fedlib.server.secagg.pack_words`, in
    the file :func:`fedlib_flower.transfer.words_layout` lays out) with the file's cohort fields."""
    import torch

    from fedlib.io import SafetensorsWriter
    from fedlib.maskfile import MaskFile
    from fedlib.server.secagg import ContributionLedger, pack_words, plan_digest
    from fedlib_flower.transfer import words_layout

    start = time.perf_counter()
    site = Site(context)
    step = wire.config(message.content, "secagg", {"round": int, "participants": (list, int),
                                                   "senders": (list, int), "ciphertexts": (list, bytes)})
    plan = wire.config(message.content, "plan", PLAN)
    client = _secagg_state(context, site, message, step["round"])
    complaints = client.receive_shares(dict(zip(step["senders"], step["ciphertexts"])), step["participants"])
    client.begin_upload(plan_digest(plan))
    _keep_secagg_state(context, client)  # before any word leaves: a second upload is refused
    ContributionLedger(Path(site.ledger)).admit(site.contribution(plan), str(message.metadata.run_id), dp=False)
    with tempfile.TemporaryDirectory() as tmp:
        upload = MaskFile(_mask_file(site, message, Path(tmp)))
        h = upload.header
        numel = {layer["name"]: layer["shape"][0] * layer["shape"][1] for layer in h.layers}
        declared, metadata = words_layout(numel, client.bits, site.client_id)
        words = Path(tmp) / "masked.safetensors"
        with SafetensorsWriter(words, declared) as writer:
            for name in numel:
                data = pack_words(client.masked_upload(name, upload.layer_mask(name)), client.bits)
                writer.add(name, torch.frombuffer(bytearray(data), dtype=torch.uint8))
            writer.close(metadata)
        cohort = {"client-id": h.client_id, "method": h.method, "group": h.group, "sparsity": h.sparsity,
                  "allocation": h.allocation, "n-samples": h.n_samples}
        _keep_secagg_state(context, client)
        return _offer(context, site, message, words, "secagg", step["round"], cohort=ConfigRecord(cohort),
                      complaints=ConfigRecord({"senders": complaints}), metrics=_metrics(start))


@app.train("secagg_confirm")
def secagg_confirm(message: Message, context: Context) -> Message:
    """Step 4: sign the survivor list the server announces (one list per round)."""
    site = Site(context, weights=False)
    step = wire.config(message.content, "secagg", {"round": int, "survivors": (list, int)})
    client = _secagg_state(context, site, message, step["round"])
    signature = client.confirm_survivors(step["survivors"])
    _keep_secagg_state(context, client)
    return Message(RecordDict({"confirm": ConfigRecord({"signature": signature})}), reply_to=message)


@app.train("secagg_reveal")
def secagg_reveal(message: Message, context: Context) -> Message:
    """Step 5 (once per round, only with t valid confirmations of the list this site confirmed):
    per site, the share of its seed if it survived, of its key if not."""
    from fedlib.server.secagg import SHARE_BYTES

    site = Site(context, weights=False)
    step = wire.config(message.content, "secagg", {"round": int, "survivors": (list, int), "signers": (list, int),
                                                   "signatures": (list, bytes)})
    client = _secagg_state(context, site, message, step["round"])
    revealed = client.reveal(step["survivors"], dict(zip(step["signers"], step["signatures"])))
    _keep_secagg_state(context, client)
    owners = sorted(revealed)
    return Message(RecordDict({"reveal": ConfigRecord({
        "owners": owners, "kinds": [revealed[o][0] for o in owners],
        "values": [revealed[o][1][1].to_bytes(SHARE_BYTES, "little") for o in owners]})}), reply_to=message)
