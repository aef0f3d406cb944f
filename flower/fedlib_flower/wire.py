"""What travels in Flower messages: message types, files as byte arrays, checked on arrival.

A file (mask file, weight file, global file) travels as one ``Array`` of ``uint8`` (Flower cuts
it into 5 MB chunks) under a fixed key, never as pickled or numpy-serialized data: the receiver
writes the bytes to disk and reads them with fedlib's strict reader. Anything else in a reply
(configs, metrics) is checked key by key here, and a message that does not have the expected
shape raises :class:`WireError` naming the record and the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

HELLO = "query.hello"
TRAIN_MASK = "train.mask"
TRAIN_WEIGHTS = "train.weights"
SECAGG_KEYS = "train.secagg_keys"
SECAGG_SHARES = "train.secagg_shares"
SECAGG_UPLOAD = "train.secagg_upload"
SECAGG_CONFIRM = "train.secagg_confirm"
SECAGG_REVEAL = "train.secagg_reveal"
UPLOAD_CHUNK = "query.upload_chunk"

#: the ``stype`` of a file's bytes: raw, not numpy's serialization
FILE_STYPE = "fedlib.file"
FILE_KEY = "file"


class WireError(ValueError):
    """A message whose content is not what the protocol sends."""

    def __init__(self, record: str, key: str, message: str):
        self.record, self.key = record, key
        self.field = key  # what a refusal names (fedlib's errors' ``field``)
        super().__init__(f"record {record!r}: key {key!r}: {message}")


#: a site's per-reply measurements, in every upload's ``metrics`` record
METRICS = {"seconds": float, "peak-rss-mib": float}


def hello_statement(run_id: int, node_id: int, challenge: bytes) -> bytes:
    """What a site signs in ``hello``: the coordinator's fresh challenge, bound to the Flower run
    and the node it was sent to (a signature is good for that node of that run only)."""
    return b"fedlib-hello\0" + run_id.to_bytes(8, "big") + node_id.to_bytes(8, "big") + challenge


def declared_bytes(content: RecordDict) -> int:
    """The payload bytes a message says it carries: each array's declared shape (``uint8``
    arrays: one byte an entry, by arithmetic; others are refused by the readers), each bytes
    value's length. Checked against a limit before any payload is read."""
    total = 0
    for record in content.values():
        for value in record.values():
            if isinstance(value, Array):
                count = 1
                for n in value.shape:
                    count *= max(int(n), 0)
                total += count
            elif isinstance(value, bytes):
                total += len(value)
            elif isinstance(value, list):
                total += sum(len(v) for v in value if isinstance(v, bytes))
    return total


def file_record(data: bytes) -> ArrayRecord:
    return ArrayRecord(array_dict={FILE_KEY: raw_array(data)})


def raw_array(data: bytes) -> Array:
    return Array(dtype="uint8", shape=(len(data),), stype=FILE_STYPE, data=bytes(data))


def raw_bytes(record: str, key: str, array: object) -> bytes:
    """The bytes of a raw ``uint8`` array, checked: its shape says its length."""
    if not isinstance(array, Array) or array.dtype != "uint8" or array.stype != FILE_STYPE:
        raise WireError(record, key, f"expected raw uint8 bytes (stype {FILE_STYPE!r})")
    if tuple(array.shape) != (len(array.data),):
        raise WireError(record, key, f"shape {tuple(array.shape)} does not match its {len(array.data)} bytes")
    return bytes(array.data)


def metrics(content: RecordDict) -> dict:
    """``content["metrics"]``: exactly the keys of :data:`METRICS`, finite non-negative numbers."""
    record = content.get("metrics") if "metrics" in content else None
    if not isinstance(record, MetricRecord):
        raise WireError("metrics", "*", "missing: expected a metric record")
    if set(record) != set(METRICS):
        raise WireError("metrics", sorted(set(record) ^ set(METRICS))[0], f"expected exactly the keys {sorted(METRICS)}")
    out = {}
    for key in METRICS:
        value = record[key]
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise WireError("metrics", key, f"expected a finite number >= 0, got {value!r}")
        out[key] = float(value)
    return out


def file_bytes(content: RecordDict, name: str) -> bytes:
    """The file carried in ``content[name]`` (a record holding exactly one raw array)."""
    record = content.get(name) if name in content else None
    if not isinstance(record, ArrayRecord):
        raise WireError(name, FILE_KEY, "missing: expected a file")
    if list(record) != [FILE_KEY]:
        raise WireError(name, FILE_KEY, f"expected exactly one array {FILE_KEY!r}, got {sorted(record)[:5]}")
    return raw_bytes(name, FILE_KEY, record[FILE_KEY])


def config(content: RecordDict, name: str, expected: Mapping[str, type]) -> dict:
    """``content[name]``, a ConfigRecord with exactly the keys of ``expected``, each value of its
    type (``list[int]`` / ``list[bytes]`` / ``list[str]`` written as ``(list, int)`` ...)."""
    record = content.get(name) if name in content else None
    if not isinstance(record, ConfigRecord):
        raise WireError(name, "*", "missing: expected a config record")
    if set(record) != set(expected):
        raise WireError(name, sorted(set(record) ^ set(expected))[0], f"expected exactly the keys {sorted(expected)}")
    out = {}
    for key, kind in expected.items():
        value = record[key]
        if isinstance(kind, tuple):  # a list of one type
            ok = isinstance(value, list) and all(type(v) is kind[1] for v in value)
        else:
            ok = type(value) is kind or (kind is float and type(value) is int)
        if not ok:
            raise WireError(name, key, f"expected {kind}, got {type(value).__name__}")
        out[key] = value
    return out
