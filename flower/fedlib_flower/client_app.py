"""A site's ClientApp: its handlers call fedlib's library on the site's own model and tokens.

The site's SuperNode names them in its node config (``--node-config``): ``model`` (the public
model's folder), ``calib`` (its private calibration token file, ``fedlib client-data`` /
``calibration-pool``), ``signing-key`` (its Ed25519 private key, PEM) and ``roster`` (the
federation's sites and their public keys, :mod:`fedlib_flower.roster`: the site's client id is
the roster's name for its own key), optionally ``threads`` (torch threads, default 1). Nothing else of the site leaves it but the uploads below; the
secure-aggregation secrets stay in the SuperNode's ``context.state``.

* ``query.hello``: its public key and a signature over the coordinator's challenge bound to the
  run and node (the coordinator gives it the id its own roster has for that key), the model
  fingerprint, fedlib version, number of samples;
* ``train.mask``: the site's mask file (one-shot, or round ``l`` of iterative FedPrLLM from the
  server's global file of blocks < l), written by :func:`fedlib.uploads.write_client_mask`;
* ``train.weights``: its FedSpaLLM weight file (:func:`fedlib.uploads.write_client_weights`);
* ``train.secagg_keys`` / ``_shares`` / ``_upload`` / ``_reveal``: the four steps of
  :mod:`fedlib.server.secagg`; the upload is the mask file's layers, masked.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
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
        self.ids = load_tokens(Path(str(config["calib"])))[0]


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
    with tempfile.TemporaryDirectory() as tmp:
        data = _mask_file(site, message, Path(tmp)).read_bytes()
    return Message(RecordDict({"upload": wire.file_record(data), "metrics": _metrics(start)}), reply_to=message)


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
        data = out.read_bytes()
    return Message(RecordDict({"upload": wire.file_record(data), "metrics": _metrics(start)}), reply_to=message)


# --------------------------------------------------------------------------- secure aggregation


def _secagg_state(context: Context, round_index: int):
    from fedlib.server.secagg import SecAggClient, SecAggError

    record = context.state.get("secagg") if "secagg" in context.state else None
    if record is None or record["round"] != round_index:
        raise SecAggError(f"round {round_index}: this site holds no secure-aggregation keys of that round")
    return SecAggClient.from_record({k: v for k, v in record.items() if k != "round"})


def _keep_secagg_state(context: Context, client, round_index: int) -> None:
    context.state["secagg"] = ConfigRecord({"round": round_index, **client.to_record()})


@app.train("secagg_keys")
def secagg_keys(message: Message, context: Context) -> Message:
    """Step 1: fresh key pairs and self-mask seed for this round; their public halves go out."""
    from fedlib.server.secagg import SecAggClient

    step = wire.config(message.content, "secagg", {"round": int, "index": int, "n-clients": int})
    client = SecAggClient.create(step["index"], step["n-clients"])
    _keep_secagg_state(context, client, step["round"])
    share_key, masking_key = client.advertise()
    return Message(RecordDict({"keys": ConfigRecord({"share-key": share_key, "masking-key": masking_key})}),
                   reply_to=message)


@app.train("secagg_shares")
def secagg_shares(message: Message, context: Context) -> Message:
    """Step 2: Shamir shares of this site's secrets, one ciphertext per site (relayed by the server)."""
    step = wire.config(message.content, "secagg", {"round": int, "threshold": int, "clients": (list, int),
                                                   "share-keys": (list, bytes), "masking-keys": (list, bytes)})
    client = _secagg_state(context, step["round"])
    advertised = {j: (c, s) for j, c, s in zip(step["clients"], step["share-keys"], step["masking-keys"])}
    outbox = client.share_secrets(advertised, step["threshold"])
    _keep_secagg_state(context, client, step["round"])
    recipients = sorted(outbox)
    return Message(RecordDict({"shares": ConfigRecord({"recipients": recipients,
                                                       "ciphertexts": [outbox[j] for j in recipients]})}),
                   reply_to=message)


@app.train("secagg_upload")
def secagg_upload(message: Message, context: Context) -> Message:
    """Step 3: take the shares sent to this site, compute its mask file, upload each layer
    masked (k-bit words, :func:`fedlib.server.secagg.pack_words`) with the file's cohort fields."""
    from fedlib.maskfile import MaskFile
    from fedlib.server.secagg import pack_words

    start = time.perf_counter()
    site = Site(context)
    step = wire.config(message.content, "secagg", {"round": int, "clients": (list, int), "senders": (list, int),
                                                   "ciphertexts": (list, bytes)})
    client = _secagg_state(context, step["round"])
    client.receive_shares(dict(zip(step["senders"], step["ciphertexts"])))
    client.restrict(step["clients"])
    _keep_secagg_state(context, client, step["round"])
    words = {}
    with tempfile.TemporaryDirectory() as tmp:
        upload = MaskFile(_mask_file(site, message, Path(tmp)))
        for layer in upload.header.layers:
            name = layer["name"]
            words[name] = wire.raw_array(pack_words(client.masked_upload(name, upload.layer_mask(name)), client.bits))
        h = upload.header
        cohort = {"client-id": h.client_id, "method": h.method, "group": h.group, "sparsity": h.sparsity,
                  "allocation": h.allocation, "n-samples": h.n_samples}
    return Message(RecordDict({"masked": ArrayRecord(array_dict=words), "cohort": ConfigRecord(cohort),
                               "metrics": _metrics(start)}), reply_to=message)


@app.train("secagg_reveal")
def secagg_reveal(message: Message, context: Context) -> Message:
    """Step 4 (once per round): per site, the share of its seed if it survived, of its key if not."""
    from fedlib.server.secagg import SHARE_BYTES

    step = wire.config(message.content, "secagg", {"round": int, "survivors": (list, int)})
    client = _secagg_state(context, step["round"])
    revealed = client.reveal(step["survivors"])
    _keep_secagg_state(context, client, step["round"])  # revealed: a second request is refused
    owners = sorted(revealed)
    return Message(RecordDict({"reveal": ConfigRecord({
        "owners": owners, "kinds": [revealed[o][0] for o in owners],
        "values": [revealed[o][1][1].to_bytes(SHARE_BYTES, "little") for o in owners]})}), reply_to=message)
