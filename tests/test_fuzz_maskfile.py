"""Hostile mask files (issue 14): every one refused with fedlib's own error, or valid.

Seeds are real files for a tiny model, written through the CLI: Wanda client masks (format
versions 1 and 2), an OWL client mask (nonuniform), FedSpaLLM weight uploads, and the global
files of both servers.
Hypothesis, derandomized (the same cases on every run), mutates them

* at the byte level: bit flips in the header and in the data, truncation, padding, insertion,
  deletion, whitespace added to the JSON header;
* at the structure level (the header re-encoded as fedlib encodes it, so that the semantic
  checks are what must catch it): metadata values, dropped and added keys, ``layers`` entries
  (JSON literals such as ``-1e400``, extra or missing keys, duplicates), tensor entries (dtype,
  shape, offsets, names, extra tensors);
* semantically, through fedlib's own writer: bits changed, claims changed (method, sparsity,
  group, allocation, counts), consistently or not.

The oracle does not ask the reader. A file is *valid* iff (1) decoding it naively and writing
the decoded content again with fedlib's writer gives the same bytes (so it is canonical, and
every count it claims is the count of its bits: the writer computes them from the bits; a
version 2 file's coded layers are decoded here with ``constriction`` against rank buckets
computed here from the checkpoint, :func:`decode_coded`), and
(2) its content obeys the protocol's rules as README and :mod:`fedlib.maskfile` state them
(:func:`spec_violations`, written out here). The reader must accept exactly the valid files
and refuse every other with :class:`MaskFileError` naming the file and a field; any other
exception fails the test. A sample also goes through the servers (first in the list, before
honest files) and through ``fedlib aggregate``: a refused file leaves no output and no
temporary file behind, and the error names the hostile file, never an honest one.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedlib.maskfile
from fedlib.cli import main
from fedlib.data import save_tokens
from fedlib.groups import GROUPS, pruned_count
from fedlib.maskcode import MagnitudeReference
from fedlib.maskfile import SPARSITY_TOLERANCE, MaskFile, MaskFileError, MaskWriter
from fedlib.methods import METHODS
from fedlib.models import LayerInfo, open_model
from fedlib.server import FedPrLLM, FedSpaLLM
from fedlib.weightfile import WeightFileWriter, open_weight_file

from conftest import tiny_llama

EXAMPLES = 11 * settings.default.max_examples  # generated files: 1,100 (make test), 110 (make test-fast)
NUMPY = {"U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F16": np.float16,
         "F32": np.float32, "F64": np.float64, "BOOL": np.bool_}
SCHEDULES = ("fedprllm", "fedprllm-iterative", "fedspallm")
#: (role, payload) -> (x_ keys always present, x_ keys that may be)
EXTRAS = {
    ("client", "mask"): (set(), {"method_options", "dtype", "dp", "dp_release"}),
    ("global", "mask"): (set(), {"rr_epsilon_per_bit", "votes"}),
    ("client", "weights"): ({"payload", "weight_dtype", "round"}, set()),
    ("global", "weights"): ({"payload", "weight_dtype", "round", "uncovered_blocks"}, {"rounding"}),
}


@dataclass
class Seed:
    name: str
    data: bytes
    payload: str  # what the server expects: "mask" or "weights"

    @property
    def header_end(self) -> int:
        return 8 + int.from_bytes(self.data[:8], "little")

    def header(self) -> dict:
        return json.loads(self.data[8:self.header_end])


@dataclass
class Corpus:
    root: Path
    model_dir: Path
    fingerprint: str
    layers: list
    seeds: dict
    honest: dict  # payload -> paths of honest client files
    weights: dict  # layer -> its stored weight (the public model a version 2 file is coded against)
    reference: MagnitudeReference  # fedlib's, for the reader and the writer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    root = tmp_path_factory.mktemp("fuzz")
    model_dir = root / "model"
    tiny_llama().save_pretrained(model_dir)

    def run(*argv):
        assert main([str(a) for a in argv]) == 0

    calib = []
    for client in range(3):
        calib.append(root / f"calib_{client}.safetensors")
        save_tokens(calib[-1], torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(client)),
                    unit="span", windows_per_unit=1)  # disjoint spans: what a DP mask needs
    model = ("--model", model_dir)
    wanda = [root / f"wanda_{c}.mask.safetensors" for c in range(3)]
    for c, out in enumerate(wanda):
        run("client-mask", *model, "--calib", calib[c], "--client-id", c, "--group", "row", "--out", out)
    coded = root / "wanda_v2.mask.safetensors"
    run("client-mask", *model, "--calib", calib[0], "--client-id", 0, "--group", "row", "--format-version", 2,
        "--out", coded)
    wanda_dp = root / "wanda_dp.mask.safetensors"
    run("client-mask", *model, "--calib", calib[0], "--client-id", "dp-0", "--dp-epsilon", 2, "--dp-delta", 1e-5,
        "--dp-clip", 1, "--out", wanda_dp)
    owl = root / "owl.mask.safetensors"
    run("client-mask", *model, "--calib", calib[0], "--client-id", "owl-0", "--method", "owl", "--group", "layer",
        "--method-options", '{"lam": 0.1, "outlier_m": 1.5}', "--out", owl)
    uploads = [root / f"upload_{c}.weights.safetensors" for c in range(2)]
    for c, out in enumerate(uploads):
        run("client-weights", *model, "--calib", calib[c], "--client-id", c, "--blocks", 0, 1, "--sparsity", 0.7,
            "--out", out)
    fedprllm = root / "global.mask.safetensors"
    run("aggregate", *model, "--group", "layer", "--out", fedprllm, *wanda)
    fedspallm = root / "global.weights.safetensors"
    run("aggregate", *model, "--strategy", "fedspallm", "--sparsity", 0.7, "--round", 0, "--out", fedspallm, *uploads)
    handle = open_model(str(model_dir), weights=False)
    seeds = [Seed("wanda", wanda[0].read_bytes(), "mask"), Seed("wanda-v2", coded.read_bytes(), "mask"),
             Seed("owl", owl.read_bytes(), "mask"), Seed("wanda-dp", wanda_dp.read_bytes(), "mask"),
             Seed("upload", uploads[0].read_bytes(), "weights"), Seed("fedprllm-global", fedprllm.read_bytes(), "mask"),
             Seed("fedspallm-global", fedspallm.read_bytes(), "weights")]
    stored = load_file(model_dir / "model.safetensors")
    weights = {info.name: stored[f"{info.name}.weight"] for info in handle.layers()}
    return Corpus(root, model_dir, handle.fingerprint(), handle.layers(), {s.name: s for s in seeds},
                  {"mask": wanda[1:], "weights": uploads[1:]}, weights, MagnitudeReference(weights.__getitem__))


# --------------------------------------------------------------------------- the oracle


def decode(data: bytes, corpus: Corpus):
    """Naive safetensors decoding: (metadata, tensors), or None. A version 2 file's coded
    ``mask:`` tensors come back as packed bits, as version 1 stores them."""
    try:
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + length])
        meta = header.pop("__metadata__")
        tensors = {}
        for name, entry in header.items():
            start, end = entry["data_offsets"]
            array = np.frombuffer(data[8 + length + start:8 + length + end], dtype=NUMPY[entry["dtype"]])
            tensors[name] = torch.from_numpy(array.reshape(entry["shape"]).copy())
        if meta.get("format_version") == "2":
            for entry in json.loads(meta["layers"]):
                bits = decode_coded(tensors[f"mask:{entry['name']}"], corpus.weights[entry["name"]], meta["group"])
                if list(bits.shape) != entry["shape"]:
                    return None
                tensors[f"mask:{entry['name']}"] = torch.from_numpy(np.packbits(bits.reshape(-1), bitorder="little"))
        json.loads(meta["layers"])
        return meta, tensors
    except Exception:  # anything that does not decode is not a valid file
        return None


def decode_coded(payload: torch.Tensor, weight: torch.Tensor, group: str) -> np.ndarray:
    """A version 2 layer, from fedlib.maskcode's description: rank buckets of |w| within each
    group (ties by position), min(64, group size) of them; a uint16 probability per bucket, then
    ANS words; the weights bucket by bucket, each in row-major order."""
    import constriction

    w = weight.float().abs()
    nm = re.fullmatch(r"([0-9]+):([0-9]+)", group)
    view = {"row": w, "column": w.T, "layer": w.reshape(1, -1)}.get(group) if not nm else w.reshape(-1, int(nm[2]))
    size = view.shape[1]
    n = min(64, size)
    rank = torch.empty(view.shape, dtype=torch.int64).scatter_(
        1, torch.argsort(view, dim=1, stable=True), torch.arange(size).expand(view.shape).contiguous())
    buckets = (rank * n // size)
    buckets = (buckets.T if group == "column" else buckets.reshape(w.shape)).reshape(-1).numpy()
    data = payload.numpy()
    table = data[:2 * n].view("<u2")
    coder = constriction.stream.stack.AnsCoder(data[2 * n:].view("<u4").astype(np.uint32))
    bits = np.empty(buckets.size, dtype=bool)
    for b in range(n):
        where = np.flatnonzero(buckets == b)
        model = constriction.stream.model.Bernoulli(float(table[b]) / 65536, perfect=False)
        bits[where] = coder.decode(model, where.size).astype(bool)
    return bits.reshape(w.shape)


@contextlib.contextmanager
def writing_as_version(version: str):
    """The writer records its own fedlib version; a file from another version is as valid."""
    saved = fedlib.maskfile.__version__
    fedlib.maskfile.__version__ = version
    try:
        yield
    finally:
        fedlib.maskfile.__version__ = saved


def unpack(packed: torch.Tensor, shape) -> torch.Tensor:
    bits = np.unpackbits(packed.numpy(), count=math.prod(shape), bitorder="little")
    return torch.from_numpy(bits.astype(bool)).reshape(shape)


def rewrite(meta: dict, tensors: dict, folder: Path, corpus: Corpus) -> bytes | None:
    """The bytes fedlib's writer gives for this content (None if it refuses to write it)."""
    out = folder / "rewritten.safetensors"
    try:
        layers = [LayerInfo(e["name"], tuple(e["shape"]), 0) for e in json.loads(meta["layers"])]
        header = dict(fingerprint=meta["model_fingerprint"], role=meta["role"], client_id=meta["client_id"],
                      method=meta["method"], group=meta["group"], sparsity=float(meta["sparsity"]),
                      allocation=meta["allocation"], n_samples=int(meta["n_samples"]), seed=int(meta["seed"]),
                      n_clients=int(meta["n_clients"]))
        extra = {k[2:]: v for k, v in meta.items() if k.startswith("x_")}
        votes = any(name.startswith("votes:") for name in tensors)
        masks = {info.name: unpack(tensors[f"mask:{info.name}"], info.shape) for info in layers}
        with writing_as_version(meta["fedlib_version"]):
            if "payload" in extra:  # the weight writer records these three and measures the allocation
                dtype, round_index, _ = extra.pop("weight_dtype"), int(extra.pop("round")), extra.pop("payload")
                del header["allocation"]
                with WeightFileWriter(out, layers, weight_dtype=dtype, round_index=round_index, extra=extra,
                                      votes=votes, **header) as writer:
                    for info in layers:
                        writer.add_layer(info.name, masks[info.name], tensors[f"weight:{info.name}"],
                                         tensors[f"votes:{info.name}"] if votes else None)
            else:
                coded = dict(format_version=2, reference=corpus.reference) if meta["format_version"] == "2" else {}
                with MaskWriter(out, layers, extra=extra, votes=votes, **header, **coded) as writer:
                    for info in layers:
                        writer.add(info.name, masks[info.name], tensors[f"votes:{info.name}"] if votes else None)
        return out.read_bytes()
    except Exception:  # the writer refuses this content: not a file fedlib writes
        return None
    finally:
        out.unlink(missing_ok=True)


def _printable(text, limit=256) -> bool:
    return isinstance(text, str) and 0 < len(text) <= limit and text.isprintable() and text == text.strip()


def _client_id_ok(text) -> bool:
    """A client id names a file: ASCII letters and digits, then also ``._-``, at most 128."""
    return (isinstance(text, str) and 0 < len(text) <= 128 and text.isascii() and text[0].isalnum()
            and all(c.isalnum() or c in "._-" for c in text))


def _canonical_json(text, kind):
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, kind) and json.dumps(value) == text else None


def _epsilon_ok(text) -> bool:
    """A positive epsilon (inf included) as repr writes a float or an int."""
    try:
        return text == "inf" or (float(text) > 0 and text in (repr(float(text)), str(int(float(text)))))
    except (ValueError, OverflowError):
        return False


DP_KEYS = ["epsilon", "delta", "clip", "sigma", "accountant", "neighbours", "releases"]
#: what x_dp ends with since releases name their protected unit and noise source (older files lack them)
DP_RELEASE_KEYS = ["unit", "windows_per_unit", "noise"]


def _dp_ok(text, meta, layers) -> bool:
    """A DP client's guarantee (README): compact JSON with exactly these keys in order, floats in
    range, PLD on replace-one neighbours, one release per distinct linear input (q/k/v share
    one, gate/up share one), a sigma that gives (epsilon, delta) by the exact Gaussian
    composition, on plain Wanda."""
    from scipy.stats import norm

    value = json.loads(text)
    if (not isinstance(value, dict) or list(value) not in (DP_KEYS, DP_KEYS + DP_RELEASE_KEYS)
            or json.dumps(value, separators=(",", ":")) != text):
        return False
    if "unit" in value:
        k = value["windows_per_unit"]
        if not (value["unit"] in ("document", "span", "client", "window") and type(k) is int and k >= 1
                and (k == 1 or value["unit"] in ("document", "span")) and value["noise"] in ("secret", "seeded")):
            return False
    eps, delta, clip, sigma, releases = (value[k] for k in ("epsilon", "delta", "clip", "sigma", "releases"))
    if not (all(type(v) is float for v in (eps, delta, clip, sigma)) and type(releases) is int
            and eps > 0 and 0 < delta < 1 and clip > 0 and sigma > 0 and value["accountant"] == "pld"
            and value["neighbours"] == "replace-one"):
        return False
    shared = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
    inputs = {(e["name"].split(".")[2], shared.get(e["name"].rsplit(".", 1)[1], e["name"])) for e in layers}
    mu = math.sqrt(releases) / sigma
    exact_delta = norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
    return (releases == len(inputs) and exact_delta <= delta * (1 + 1e-9) and meta["method"] == "wanda"
            and json.loads(meta.get("x_method_options", "{}")) == {})


def _group_size(group: str, shape) -> tuple[int, int]:
    """(number of groups, group size) of a row/column/layer group."""
    rows, cols = shape
    return {"layer": (1, rows * cols), "row": (rows, cols), "column": (cols, rows)}[group]


def spec_violations(meta: dict, tensors: dict, corpus: Corpus, payload_expected: str) -> list[str]:
    """The protocol's rules (README, fedlib.maskfile's docstring), on a canonical file."""
    bad = []
    role, method, group = meta["role"], meta["method"], meta["group"]
    payload = "weights" if "x_payload" in meta else "mask"
    layers = json.loads(meta["layers"])
    if meta["model_fingerprint"] != corpus.fingerprint:
        bad.append("fingerprint")
    if [(e["name"], tuple(e["shape"])) for e in layers] != [(i.name, i.shape) for i in corpus.layers]:
        bad.append("layers")
    if payload_expected == "weights" and payload != "weights":
        bad.append("payload")
    version = meta["fedlib_version"]  # a digit, then PEP 440's alphabet
    if not (_client_id_ok(meta["client_id"]) and _printable(meta["model_fingerprint"]) and len(version) <= 64
            and version[:1].isascii() and version[:1].isdigit()
            and all(c.isascii() and (c.isalnum() or c in ".+-") for c in version)):
        bad.append("text")
    if role not in ("client", "global"):
        return bad + ["role"]
    inner = None
    if role == "client":
        inner = method
        if method not in METHODS:
            bad.append("method")
        if meta["n_clients"] != "1":
            bad.append("n_clients")
    else:
        match = re.fullmatch(r"([a-z][a-z0-9-]*)(?:\[([a-z0-9_]+)\]([A-Za-z0-9_.+-]*))?", method)
        if method != "random" and (match is None or match[1] not in SCHEDULES
                                   or (match[2] is not None and match[2] not in METHODS)):
            bad.append("method")
        inner = match[2] if match and method != "random" else None
        if int(meta["n_clients"]) < 1:
            bad.append("n_clients")
    nm = re.fullmatch(r"([1-9][0-9]*):([1-9][0-9]*)", group)
    if group not in GROUPS and not (nm and int(nm[1]) < int(nm[2])):
        return bad + ["group"]
    sparsity = float(meta["sparsity"])
    if not 0 <= sparsity < 1:
        return bad + ["sparsity"]
    if meta["allocation"] not in ("uniform", "nonuniform"):
        return bad + ["allocation"]
    if int(meta["n_samples"]) < 0 or int(meta["seed"]) < 0:
        bad.append("counts")
    always, optional = EXTRAS[(role, payload)]
    extras = {k[2:]: v for k, v in meta.items() if k.startswith("x_")}
    if not always <= set(extras) <= always | optional:
        bad.append("extras")
    options = {}
    for key, value in extras.items():
        ok = lambda v: False  # noqa: E731 (an unknown key)
        check = {"method_options": lambda v: _canonical_json(v, dict) is not None,
              "dtype": lambda v: v in ("float32", "bfloat16", "float16"),
              "rr_epsilon_per_bit": _epsilon_ok,
              "votes": _printable,
              "payload": lambda v: v == "weights",
              "weight_dtype": lambda v: v in ("float16", "float32"),
              "round": lambda v: int(v) >= 0,  # the writer writes str(int(x))
              "uncovered_blocks": lambda v: (_canonical_json(v, list) is not None and all(
                  type(b) is int and b >= 0 for b in json.loads(v)) and json.loads(v) == sorted(set(json.loads(v)))),
              "rounding": lambda v: v in ("ceil", "floor"),
              "dp": lambda v: _dp_ok(v, meta, layers),
              "dp_release": lambda v: "x_dp" in meta and re.fullmatch(r"sha256:[0-9a-f]{64}", v) is not None,
              }.get(key, ok)
        try:
            ok = check(value)
        except ValueError:
            ok = False
        if not ok:
            bad.append(f"x_{key}")
        elif key == "method_options":
            options = json.loads(value)
    if "uncovered_blocks" in extras and "x_uncovered_blocks" not in bad:
        listed = {int(e["name"].split(".")[2]) for e in layers}
        if json.loads(extras["uncovered_blocks"]) != sorted({i.block for i in corpus.layers} - listed):
            bad.append("x_uncovered_blocks")
    if any(name.startswith("votes:") for name in tensors):
        if role != "global":
            bad.append("votes")
        elif any(int(v.min()) < 0 or int(v.max()) > int(meta["n_clients"])
                 for name, v in tensors.items() if name.startswith("votes:")):
            bad.append("votes")
    if bad:
        return bad
    # counts: the bits' (the rewrite made the claims equal to them)
    allocation = meta["allocation"]
    masks = {e["name"]: unpack(tensors[f"mask:{e['name']}"], e["shape"]) for e in layers}
    if inner is not None and payload == "mask" and METHODS[inner].allocation != allocation:
        return ["allocation"]
    if nm:
        n, m = int(nm[1]), int(nm[2])
        for mask in masks.values():
            if mask.shape[1] % m or not (mask.reshape(mask.shape[0], -1, m).sum(-1) == n).all():
                return ["n:m"]
    elif allocation == "uniform":
        for mask in masks.values():
            groups, size = _group_size(group, mask.shape)
            per_group = mask.reshape(1, -1) if group == "layer" else mask if group == "row" else mask.T
            if not (per_group.sum(1) == pruned_count(size, sparsity)).all():
                return ["uniform"]
    elif role == "client":
        if group not in GROUPS:
            return ["nonuniform group"]
        try:
            lo, hi = METHODS[method].layer_sparsity_bounds(sparsity, options)
        except (TypeError, ValueError):
            return ["x_method_options"]
        lo, hi = max(0.0, lo - 1e-9), min(1.0, hi + 1e-9)
        for mask in masks.values():
            groups, size = _group_size(group, mask.shape)
            per_group = mask.reshape(1, -1) if group == "layer" else mask if group == "row" else mask.T
            counts = per_group.sum(1)
            top = min(size, math.ceil(size * hi - 1e-9)) if payload == "weights" else pruned_count(size, hi)
            if not (counts == counts[0]).all() or not pruned_count(size, lo) <= int(counts[0]) <= top:
                return ["bounds"]
    for e in layers:  # a global mask prunes the most-voted weights of each group
        if f"votes:{e['name']}" not in tensors:
            continue
        votes, mask = tensors[f"votes:{e['name']}"].numpy().astype(int), masks[e["name"]].numpy()
        if nm:
            chunks = zip(votes.reshape(-1, int(nm[2])), mask.reshape(-1, int(nm[2])))
        else:
            chunks = {"layer": [(votes.reshape(-1), mask.reshape(-1))], "row": zip(votes, mask),
                      "column": zip(votes.T, mask.T)}[group]
        if any(v[m].size and v[~m].size and v[m].min() < v[~m].max() for v, m in chunks):
            return ["votes order"]
    target = int(nm[1]) / int(nm[2]) if nm else sparsity
    total = sum(int(mask.sum()) for mask in masks.values()) / sum(mask.numel() for mask in masks.values())
    if abs(total - target) > SPARSITY_TOLERANCE + max(1 / min(mask.shape) for mask in masks.values()):
        return ["budget"]
    return []


def is_valid(data: bytes, corpus: Corpus, payload: str, folder: Path) -> bool:
    decoded = decode(data, corpus)
    if decoded is None:
        return False
    meta, tensors = decoded
    length = int.from_bytes(data[:8], "little")
    if encode(json.loads(data[8:8 + length]), data[8 + length:]) != data:
        return False  # the header is not in canonical form: no need to ask the writer
    if rewrite(meta, tensors, folder, corpus) != data:
        return False
    return not spec_violations(meta, tensors, corpus, payload)


def read_all(path: Path, corpus: Corpus, payload: str) -> MaskFileError | None:
    """The reader's verdict: None (accepted: header and every tensor read and checked) or its
    MaskFileError. Any other exception escapes (a crash is a failure)."""
    try:
        if payload == "weights":
            wf = open_weight_file(path, corpus.fingerprint, corpus.layers)
            for name in wf.layer_names:
                wf.layer_weight(name, wf.layer_mask(name))
                if wf.has_votes():
                    wf.layer_votes(name)
        else:
            mf = MaskFile(path, corpus.fingerprint, corpus.layers, reference=corpus.reference)
            for info in corpus.layers:
                mf.layer_mask(info.name)
                if mf.has_votes():
                    mf.layer_votes(info.name)
    except MaskFileError as err:
        return err
    return None


# --------------------------------------------------------------------------- mutations


def encode(header: dict, body: bytes) -> bytes:
    """A safetensors file as fedlib encodes one: sorted compact JSON, padded with spaces to 8."""
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + body


HOSTILE_TEXT = ["", " ", "-1", "01", "+1", "1e400", "-1e400", "nan", "inf", "0.5 ", " 0.5", "0.50", "1.0", "0.9999",
                "-0.0", "1_0", "٣", "99999999999999999999", "0x10", "true", "null", "[]", "{}", '{"lam": 2}',
                '{"lam":0.1}', '{"lam": NaN}', '{"unknown": 1}', "wanda", "owl", "magnitude", "besa", "sparsegpt",
                "sparsegpt_update", "random", "fedprllm[wanda]", "fedprllm[nope]", "fedprllm-iterative[owl]+rr",
                "fedspallm", "evil[wanda]", "client", "global", "uniform", "nonuniform", "row", "layer", "column",
                "2:4", "5:4", "02:4", "0:4", "2:3", "0.7", "0.3", "0.5", "1", "2", "3", "float16", "bfloat16",
                "weights", "mask", "ceil", "floor", "[0]", "[1, 0]", "[0, 0]", "[0,1]", "a\nb", "x" * 300, "é"]


def hostile_text():
    return st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=8),
                     st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True).map(repr))


def with_body(seed: Seed, header: dict) -> bytes:
    return encode(header, seed.data[seed.header_end:])


def mutate_bytes(data, seed: Seed, kind: str) -> bytes:
    blob, end = bytearray(seed.data), seed.header_end
    if kind == "flip-header":
        pos = data.draw(st.integers(0, end - 1))
        blob[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "flip-data":
        pos = data.draw(st.integers(end, len(blob) - 1))
        blob[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        del blob[data.draw(st.integers(0, len(blob) - 1)):]
    elif kind == "pad":
        blob += data.draw(st.one_of(st.binary(min_size=1, max_size=16), st.integers(1, 16).map(lambda n: b" " * n)))
    elif kind == "insert":
        pos = data.draw(st.integers(0, len(blob)))
        blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    elif kind == "delete":
        pos = data.draw(st.integers(0, len(blob) - 1))
        del blob[pos:pos + data.draw(st.integers(1, 8))]
    elif kind == "header-whitespace":
        text = bytes(blob[8:end]).rstrip(b" ")
        spots = [i + 1 for i, c in enumerate(text) if c in b",:{["] + [0, len(text)]
        pos = data.draw(st.sampled_from(spots))
        spaces = data.draw(st.sampled_from([b" ", b" " * 8, b"\n", b"\t", b" " * 3]))
        text = text[:pos] + spaces + text[pos:]
        text += b" " * data.draw(st.sampled_from([0, -len(text) % 8, -len(text) % 8 + 8]))
        blob = bytearray(len(text).to_bytes(8, "little") + text + seed.data[end:])
    return bytes(blob)


def mutate_metadata(data, seed: Seed, kind: str) -> bytes:
    header = seed.header()
    meta = header["__metadata__"]
    if kind == "meta-value":
        meta[data.draw(st.sampled_from(sorted(meta)))] = data.draw(hostile_text())
    elif kind == "meta-drop":
        del meta[data.draw(st.sampled_from(sorted(meta)))]
    elif kind == "meta-add":
        key = data.draw(st.sampled_from(["x_method_options", "x_dtype", "x_payload", "x_round", "x_votes", "x_seed",
                                         "x_rr_epsilon_per_bit", "x_uncovered_blocks", "x_rounding", "x_weight_dtype", "x_dp",
                                         "x_synthetic", "x_", "note", "Format"]))
        meta[key] = data.draw(hostile_text())
    return with_body(seed, header)


#: DP guarantees a client may claim (its bits unchanged): honest, too little noise, out of range, malformed
DP_CLAIMS = [
    '{"epsilon":2.0,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":8.0,"delta":1e-05,"clip":3.0,"sigma":2.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":8.0,"delta":1e-05,"clip":3.0,"sigma":1.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":0.5,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":2.0,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":14}',
    '{"epsilon":2.0,"delta":1.0,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":2.0,"delta":1e-05,"clip":-1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":2,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon":2.0,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"rdp","neighbours":"replace-one","releases":8}',
    '{"epsilon":2.0,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"add-remove","releases":8}',
    '{"delta":1e-05,"epsilon":2.0,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
    '{"epsilon": 2.0, "delta": 1e-05, "clip": 1.0, "sigma": 6.0, "accountant": "pld", "neighbours": "replace-one", '
    '"releases": 8}',
    '{"epsilon":2.0,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one"}',
    '{"epsilon":1e400,"delta":1e-05,"clip":1.0,"sigma":6.0,"accountant":"pld","neighbours":"replace-one","releases":8}',
]
JSON_LITERALS = ["-1e400", "1e400", "32.0", "true", "false", "-32", "0", "4294967296", "1" * 30, "null", '"32"', "[]",
                 "[32]", "[32,32,1]", "[-1,-1]", "[32,0]", "[0,32]", "[true,32]", "[32.0,32]", "[1e400,32]", "-0",
                 "[2147483649,2]", "{}", "NaN", "-Infinity"]


def mutate_layers(data, seed: Seed, kind: str) -> bytes:
    header = seed.header()
    meta = header["__metadata__"]
    layers = json.loads(meta["layers"])
    i = data.draw(st.integers(0, len(layers) - 1))
    op = data.draw(st.sampled_from(["shape-literal", "pruned-literal", "extra-key", "drop-key", "reorder-keys",
                                    "rename", "duplicate-name", "swap", "drop-entry", "duplicate-entry", "not-object",
                                    "whitespace", "pruned-delta", "not-a-list"]))
    text = None
    if op in ("shape-literal", "pruned-literal"):
        key = "shape" if op == "shape-literal" else "pruned"
        layers[i][key] = "@@"
        text = json.dumps(layers, separators=(",", ":")).replace('"@@"', data.draw(st.sampled_from(JSON_LITERALS)))
    elif op == "extra-key":
        layers[i][data.draw(st.sampled_from(["extra", "block", "name ", "Name"]))] = data.draw(st.integers(0, 3))
    elif op == "drop-key":
        del layers[i][data.draw(st.sampled_from(["name", "shape", "pruned"]))]
    elif op == "reorder-keys":
        layers[i] = {"pruned": layers[i]["pruned"], "name": layers[i]["name"], "shape": layers[i]["shape"]}
    elif op == "rename":
        layers[i]["name"] = data.draw(st.sampled_from(["", "foo", layers[i]["name"] + " ", "mask:x", "a\tb"]))
    elif op == "duplicate-name":
        layers[i]["name"] = layers[(i + 1) % len(layers)]["name"]
    elif op == "swap":
        j = (i + 1) % len(layers)
        layers[i], layers[j] = layers[j], layers[i]
    elif op == "drop-entry":
        del layers[i]
    elif op == "duplicate-entry":
        layers.insert(i, dict(layers[i]))
    elif op == "not-object":
        layers[i] = data.draw(st.sampled_from([[layers[i]["name"]], "x", 3, None]))
    elif op == "whitespace":
        text = json.dumps(layers)
    elif op == "pruned-delta":
        layers[i]["pruned"] += data.draw(st.sampled_from([-2, -1, 1, 2, 10**6]))
    elif op == "not-a-list":
        text = json.dumps({"layers": layers}, separators=(",", ":"))
    meta["layers"] = text if text is not None else json.dumps(layers, separators=(",", ":"))
    return with_body(seed, header)


def mutate_tensors(data, seed: Seed, kind: str) -> bytes:
    header = seed.header()
    names = sorted(k for k in header if k != "__metadata__")
    name = data.draw(st.sampled_from(names))
    entry = header[name]
    body = seed.data[seed.header_end:]
    op = data.draw(st.sampled_from(["dtype", "shape", "offsets", "rename", "drop", "extra-tensor", "extra-field",
                                    "swap-offsets"]))
    if op == "dtype":
        entry["dtype"] = data.draw(st.sampled_from(["U8", "I8", "I16", "I32", "F16", "F32", "F64", "BF16", "BOOL", "u8", "X"]))
    elif op == "shape":
        entry["shape"] = data.draw(st.sampled_from([[], [0], [1], entry["shape"] + [1], entry["shape"][::-1],
                                                    [s * 2 for s in entry["shape"]], [-1]]))
    elif op == "offsets":
        start, end = entry["data_offsets"]
        delta = data.draw(st.sampled_from([-8, -1, 1, 8, len(body)]))
        entry["data_offsets"] = data.draw(st.sampled_from([[start + delta, end + delta], [start, end + delta],
                                                           [end, start]]))
    elif op == "rename":
        header[data.draw(st.sampled_from([name + "x", name.upper(), "mask:" + name, "extra"]))] = header.pop(name)
    elif op == "drop":
        del header[name]
    elif op == "extra-tensor":
        extra = data.draw(st.sampled_from(["extra", "votes:" + name.split(":", 1)[1], "weight:" + name.split(":", 1)[1],
                                           "mask:model.layers.9.mlp.up_proj", "__metadata__x"]))
        if extra not in header:
            header[extra] = {"dtype": "U8", "shape": [8], "data_offsets": [len(body), len(body) + 8]}
            body += bytes(8)
    elif op == "extra-field":
        entry["extra"] = 0
    elif op == "swap-offsets":
        other = header[data.draw(st.sampled_from(names))]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    return encode(header, body)


def mutate_semantics(data, seed: Seed, kind: str, corpus: Corpus) -> bytes:
    """Through fedlib's writer: the file is canonical, its claims are its bits' counts."""
    meta, tensors = decode(seed.data, corpus)
    layers = json.loads(meta["layers"])
    i = data.draw(st.integers(0, len(layers) - 1))
    key = f"mask:{layers[i]['name']}"
    bits = unpack(tensors[key], layers[i]["shape"])
    if kind == "bits":
        op = data.draw(st.sampled_from(["flip", "swap-in-row", "swap-anywhere", "all", "none", "invert"]))
        flat = bits.reshape(-1)
        if op == "flip":
            for pos in data.draw(st.lists(st.integers(0, flat.numel() - 1), min_size=1, max_size=4)):
                flat[pos] = ~flat[pos]
        elif op in ("swap-in-row", "swap-anywhere"):
            row = data.draw(st.integers(0, bits.shape[0] - 1))
            pool = bits[row] if op == "swap-in-row" else flat
            pruned, kept = pool.nonzero().reshape(-1), (~pool).nonzero().reshape(-1)
            if len(pruned) and len(kept):
                a = int(pruned[data.draw(st.integers(0, len(pruned) - 1))])
                b = int(kept[data.draw(st.integers(0, len(kept) - 1))])
                pool[a], pool[b] = False, True
        elif op in ("all", "none"):  # 100 % / 0 % in this layer, the rest moved to keep the budget
            bits[:] = op == "all"
        else:
            bits = ~bits
        tensors[key] = torch.from_numpy(np.packbits(bits.reshape(-1).numpy(), bitorder="little"))
        if op in ("all", "none"):  # a compensating layer, so only the per-layer bound can refuse it
            j = (i + 1) % len(layers)
            other = unpack(tensors[f"mask:{layers[j]['name']}"], layers[j]["shape"])
            other[:] = op == "none"
            tensors[f"mask:{layers[j]['name']}"] = torch.from_numpy(np.packbits(other.reshape(-1).numpy(), bitorder="little"))
        if "x_payload" in meta:  # keep the weights the mask prunes at +0.0 (the writer would anyway)
            weight = tensors[f"weight:{layers[i]['name']}"]
            tensors[f"weight:{layers[i]['name']}"] = torch.where(bits, torch.zeros_like(weight), weight + (weight == 0))
    else:  # claims: header fields through the writer, bits as they are
        field = data.draw(st.sampled_from(["method", "sparsity", "group", "allocation", "client_id", "n_samples",
                                           "seed", "n_clients", "role", "fedlib_version", "x_method_options",
                                           "x_dp"]))
        meta[field] = data.draw(st.sampled_from({
            "method": ["wanda", "owl", "magnitude", "besa", "sparsegpt_update", "fedprllm[wanda]", "random", "nope"],
            "sparsity": ["0.5", "0.7", "0.3", "0.52", "0.0"],
            "group": ["row", "layer", "column", "2:4", "4:8"],
            "allocation": ["uniform", "nonuniform"],
            "client_id": ["7", "hospital-a", "server", "x" * 257, "../x", "/x/y", ".hidden", "a b"],
            "n_samples": ["0", "5", "-1"], "seed": ["0", "3", "-2"], "n_clients": ["1", "2", "0", "3"],
            "role": ["client", "global"], "fedlib_version": ["0.0.1", "9.9.9+local", ""],
            "x_method_options": ['{"lam": 0.2}', '{"lam": 0.01}', "{}", '{"outlier_m": 3.0, "lam": 0.1}', '{"steps": 1}'],
            "x_dp": DP_CLAIMS,
        }[field]))
    out = rewrite(meta, tensors, corpus.root, corpus)
    if out is not None:
        return out
    # the writer refuses this content: the header as fedlib encodes it, with the new claims
    header = seed.header()
    header["__metadata__"] = meta
    return with_body(seed, header)


CLASSES = {
    **{k: mutate_bytes for k in ("flip-header", "flip-data", "truncate", "pad", "insert", "delete", "header-whitespace")},
    **{k: mutate_metadata for k in ("meta-value", "meta-drop", "meta-add")},
    "layers": mutate_layers,
    "tensors": mutate_tensors,
    "bits": mutate_semantics,
    "claims": mutate_semantics,
}


# --------------------------------------------------------------------------- the run


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def aggregate_sample(corpus: Corpus, hostile: Path, payload: str, valid: bool, cli: bool) -> str:
    """The hostile file first, then the honest ones, through a server (or ``fedlib aggregate``)."""
    folder = hostile.parent / "out"
    folder.mkdir()
    out = folder / "global.safetensors"
    honest = corpus.honest[payload]
    files = [hostile, *honest]
    if cli:
        argv = ["aggregate", "--model", str(corpus.model_dir), "--group", "layer", "--out", str(out)]
        if payload == "weights":
            argv += ["--strategy", "fedspallm", "--sparsity", "0.7"]
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = main(argv + [str(p) for p in files])
        verdict = "accepted" if code == 0 else "refused"
        if code:  # one line naming the hostile file and a field, no traceback
            message = stderr.getvalue()
            assert code == 2 and str(hostile) in message and "field '" in message and "Traceback" not in message
    else:
        server = FedSpaLLM(sparsity=0.7) if payload == "weights" else FedPrLLM(group="layer", sparsity=0.5)
        try:
            options = {"reference": corpus.reference} if payload == "mask" else {}
            server.aggregate(files, corpus.fingerprint, corpus.layers, out, **options)
            verdict = "accepted"
        except MaskFileError as err:
            # an honest file is never blamed alone (two files with one id, or no majority: all are named)
            assert str(hostile) in err.path, f"the error names {err.path}, not the hostile file: {err}"
            verdict = "refused"
    if verdict == "refused":  # a valid file may still be refused: not of this cohort
        assert leftovers(folder) == [], f"a refused aggregation left {leftovers(folder)}"
    else:
        assert valid, "the server aggregated a file the protocol does not allow"
        # the CLI writes the outlier report beside the global file (after it)
        assert leftovers(folder) == (["global.clients.json"] if cli else []) + ["global.safetensors"]
        if cli:
            report = json.loads((folder / "global.clients.json").read_text())
            assert [c["path"] for c in report["clients"]] == [str(p) for p in files]
        assert read_all(out, corpus, payload) is None  # the server's own output reads back
        assert is_valid(out.read_bytes(), corpus, payload, hostile.parent)
    shutil.rmtree(folder)
    return verdict


def test_fuzz_hostile_files(corpus):
    stats, by_seed = collections.Counter(), collections.Counter()
    accepted_from = collections.defaultdict(collections.Counter)
    work = corpus.root / "cases"
    work.mkdir()
    count = iter(range(10**9))

    @settings(derandomize=True, max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def case(data):
        seed = corpus.seeds[data.draw(st.sampled_from(sorted(corpus.seeds)), label="seed")]
        kind = data.draw(st.sampled_from(sorted(CLASSES)), label="class")
        mutate = CLASSES[kind]
        blob = mutate(data, seed, kind, corpus) if mutate is mutate_semantics else mutate(data, seed, kind)
        index = next(count)
        folder = work / str(index)
        folder.mkdir()
        path = folder / "hostile.safetensors"
        path.write_bytes(blob)
        valid = is_valid(blob, corpus, seed.payload, folder)
        error = read_all(path, corpus, seed.payload)
        if error is not None:
            assert error.path == str(path) and error.field, error
            assert str(path) in str(error) and f"field {error.field!r}" in str(error)
        assert (error is None) == valid, (
            f"{kind} on {seed.name}: the reader {'refused' if error else 'accepted'} a file the oracle calls "
            f"{'valid' if valid else 'invalid'} ({error})")
        stats[kind, "accepted" if error is None else "refused"] += 1
        by_seed[seed.name, "accepted" if error is None else "refused"] += 1
        if error is None:
            accepted_from[kind]["unchanged" if blob == seed.data else seed.name] += 1
        if seed.name in ("wanda", "wanda-v2", "upload") and index % 8 == 0:  # one in 8 through a server; 1 in 64 the CLI
            stats["aggregation", aggregate_sample(corpus, path, seed.payload, valid, cli=index % 64 == 0)] += 1
        shutil.rmtree(folder)

    case()
    total = sum(n for (kind, _), n in stats.items() if kind != "aggregation")
    lines = [f"{kind:18} refused {stats[kind, 'refused']:4}  accepted {stats[kind, 'accepted']:4}  "
             f"{dict(accepted_from[kind]) if kind in accepted_from else ''}"
             for kind in [*sorted(CLASSES), "aggregation"]]
    print(f"\n{total} generated files\n" + "\n".join(lines))
    assert total >= 0.9 * EXAMPLES
    if EXAMPLES < 1000:  # make test-fast: every file got the oracle's verdict; coverage needs the full count
        return
    # the classes really reach both verdicts where a valid mutation exists (a valid flip-data case is rare)
    assert stats["bits", "accepted"] and stats["claims", "accepted"] and stats["flip-data", "accepted"]
    # and every seed, version 2's coded file among them, gives both valid and hostile files
    assert all(by_seed[name, "accepted"] and by_seed[name, "refused"] for name in corpus.seeds), by_seed


@pytest.mark.parametrize("short", [0, 1, 2, "table - 1"])
def test_a_coded_layer_shorter_than_its_table_is_refused(corpus, short):
    """A version 2 layer of fewer bytes than its probability table (2 bytes per bucket, min(64,
    row length) buckets of a row group), 0 included, laid out canonically, is refused naming the
    file and the layer's ``mask:`` field, never with torch's own error."""
    seed = corpus.seeds["wanda-v2"]
    header, body = seed.header(), seed.data[seed.header_end:]
    layer = corpus.layers[0]
    table = 2 * min(64, layer.shape[1])
    length = table - 1 if short == "table - 1" else short
    name = f"mask:{layer.name}"
    chunks = {key: body[entry["data_offsets"][0]:entry["data_offsets"][1]]
              for key, entry in header.items() if key != "__metadata__"}
    chunks[name] = chunks[name][:length]
    header[name]["shape"] = [length]
    offset, data = 0, b""
    for key in sorted(chunks):  # contiguous, in name order, as the writer lays them out
        header[key]["data_offsets"] = [offset, offset + len(chunks[key])]
        offset, data = offset + len(chunks[key]), data + chunks[key]
    path = corpus.root / f"short-{length}.safetensors"
    path.write_bytes(encode(header, data))
    assert not is_valid(path.read_bytes(), corpus, "mask", corpus.root)
    error = read_all(path, corpus, "mask")
    assert isinstance(error, MaskFileError) and error.path == str(path) and error.field == name, error
    assert f"bytes in {table}.." in str(error)
    path.unlink()
