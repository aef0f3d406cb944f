"""Cost tables from measurements: FedPrLLM Table 3 (what each client uploads and downloads),
Table 16 and App. D.3 (a round's wall-clock under network profiles, with stragglers) and
Table 15 (client / server time and peak memory from the rules' Snakemake ``benchmark:`` files).

Transfer sizes are those of real files. One-shot: each client's mask file as it was sent.
Iterative (the file protocol of ``fedlib client-mask --round L`` / ``fedlib aggregate --schedule
iterative``): round L uploads a one-block client file and downloads the server's global file of
blocks < L; these files are written here with fedlib's :class:`~fedlib.maskfile.MaskWriter` (the
same header fields the CLI writes) from the real client and global masks, and measured, so the
header overhead is real. FedSpaLLM: its simulation record (``rounds.json``: payload bytes per
round, summed over clients). The network table is a deterministic model over these bytes
(:func:`round_seconds`); the time table holds measurements and is therefore never part of a
bit-identical run.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedlib.io import write_text_atomic
from fedlib.report import provenance_lines, write_table

def upload_title(version: int) -> str:
    """The transfer table's column of uploads in mask file format ``version``, as sent
    (``upload.format_version``; FedSpaLLM's weight files pack their masks as version 1)."""
    return f"format v{version} (as sent)"


# --------------------------------------------------------------------------- transfer sizes


def _client_header_fields(header) -> dict:
    """What ``fedlib client-mask`` writes into a client file's header, read from one."""
    return {"fingerprint": header.fingerprint, "role": "client", "client_id": header.client_id,
            "method": header.method, "group": header.group, "sparsity": header.sparsity,
            "allocation": header.allocation, "n_samples": header.n_samples, "seed": header.seed,
            "extra": header.extra}


def _upload_sizes(path: Path, version: int) -> dict[str, int]:
    return {upload_title(version): os.path.getsize(path)}


def _numel(layers) -> int:
    return sum(math.prod(info.shape) for info in layers)


def fedprllm_transfer(model: Path, clients: Sequence[Path], global_file: Path, workdir: Path | None = None) -> list[dict]:
    """Per-client transfer of FedPrLLM one-shot and iterative, from real files (module docstring).

    ``clients``: the one-shot client mask files; ``global_file``: a one-shot global file (its
    masks and votes make the iterative rounds' global files: sizes do not depend on the bits)."""
    from fedlib.maskcode import MagnitudeReference
    from fedlib.maskfile import MaskFile, MaskWriter
    from fedlib.models import open_model
    from fedlib.server.fedprllm import FedPrLLM

    handle = open_model(str(model), weights=False)
    layers, fingerprint = handle.layers(), handle.fingerprint()
    reference = MagnitudeReference.of_model(handle)  # decodes version 2 uploads
    files = [MaskFile(Path(p), fingerprint, layers, reference=reference) for p in clients]
    for f in files:
        if f.header.role != "client":
            raise ValueError(f"{f.path}: field 'role': expected a client mask file, got {f.header.role!r}")
    server = MaskFile(Path(global_file), fingerprint, layers)
    if server.header.role != "global" or not server.has_votes():
        raise ValueError(f"{global_file}: field 'role': expected a global mask file with vote counts")
    d = _numel(layers)
    oneshot = {
        "strategy": "FedPrLLM one-shot", "group": server.header.group,
        "rounds": [{"up": [_upload_sizes(f.path, f.header.format_version) for f in files],
                    "down": [0] * len(files),
                    "up_parameters": d, "down_parameters": 0}],
        "final_download": os.path.getsize(global_file), "final_download_parameters": d,
    }
    blocks = sorted({info.block for info in layers})
    iterative = FedPrLLM(mode="iterative")
    rounds = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        for block in blocks:
            current = [info for info in layers if info.block == block]
            settled = [info for info in layers if info.block < block]
            up = []
            for f in files:  # one client's block in memory at a time, as a client sends it
                path = tmp / f"client_{f.header.client_id}_round{block}.mask.safetensors"
                with MaskWriter(path, current, **_client_header_fields(f.header),
                                format_version=f.header.format_version,
                                reference=reference if f.header.format_version == 2 else None) as writer:
                    for info in current:
                        writer.add(info.name, f.layer_mask(info.name))
                up.append(_upload_sizes(path, f.header.format_version))
                path.unlink()
            down = 0
            if settled:
                # what ``fedlib aggregate --schedule iterative --round block-1`` wrote: blocks < block, with votes
                path = tmp / f"global_round{block - 1}.mask.safetensors"
                h = server.header
                with MaskWriter(path, settled, fingerprint=fingerprint, role="global", client_id="server",
                                method=iterative.global_method(files[0].header.method), group=h.group,
                                sparsity=h.sparsity, allocation=h.allocation,
                                n_samples=sum(f.header.n_samples for f in files), seed=h.seed,
                                n_clients=len(files), votes=True) as writer:
                    for info in settled:
                        mask = server.layer_mask(info.name)
                        writer.add(info.name, mask, server.layer_votes(info.name, mask))
                down = os.path.getsize(path)
                path.unlink()
            rounds.append({"up": up, "down": [down] * len(files), "up_parameters": _numel(current),
                           "down_parameters": _numel(settled)})
    iterative_row = {"strategy": "FedPrLLM iterative", "group": server.header.group, "rounds": rounds,
                     "final_download": os.path.getsize(global_file), "final_download_parameters": d}
    return [oneshot, iterative_row]


def fedspallm_transfer(record: Path) -> dict:
    """FedSpaLLM from its simulation record: payload bytes per round summed over clients
    (weights + packed masks up, the global weights down), split evenly over the clients. The
    record does not count the final global model's download."""
    data = json.loads(Path(record).read_text())
    try:
        n = int(data["n_clients"])
        rounds = [(int(r["bytes_up"]), int(r["bytes_down"])) for r in data["rounds"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{record}: expected a FedSpaLLM record with n_clients and rounds[].bytes_up/"
                         f"bytes_down ({err})") from None
    return {
        "strategy": "FedSpaLLM", "group": "-",
        "rounds": [{"up": [{upload_title(1): round(u / n)}] * n, "down": [round(dn / n)] * n,
                    "up_parameters": None, "down_parameters": None} for u, dn in rounds],
        "final_download": None, "final_download_parameters": None,  # not in the record
    }


# --------------------------------------------------------------------------- transfer table


def _up(round_: dict, title: str | None = None) -> list[int]:
    """Each client's upload in ``round_``: as sent, or its size under ``title`` (None if it has none)."""
    if title is None:
        return [next(iter(sizes.values())) for sizes in round_["up"]]
    return [sizes.get(title) for sizes in round_["up"]]


def _count(value) -> str:
    return "-" if value is None else f"{value:,}"


def transfer_rows(strategies: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the Table 3 analogue; per-client figures are the largest client's."""
    titles = list(dict.fromkeys(title for s in strategies for r in s["rounds"] for sizes in r["up"] for title in sizes))
    columns = ["Strategy", "Server group", "Rounds", "Upload / client / round (bytes)"]
    columns += [f"Upload / client, total, {t}" for t in titles]
    columns += ["Upload / client (mask entries)", "Download / client in rounds (bytes)",
                "Download / client in rounds (mask entries)", "Final global file (bytes)",
                "All clients, up + down in rounds (bytes)"]
    rows = []
    for s in strategies:
        rounds = s["rounds"]
        per_round = [max(_up(r)) for r in rounds]
        span = f"{min(per_round):,}" if min(per_round) == max(per_round) else f"{min(per_round):,}–{max(per_round):,}"
        totals = []
        for t in titles:
            per_client = [sum(values) for values in zip(*(_up(r, t) for r in rounds))]
            totals.append("-" if None in per_client else f"{max(per_client):,}")
        up_params = None if rounds[0]["up_parameters"] is None else sum(r["up_parameters"] for r in rounds)
        down_params = None if rounds[0]["down_parameters"] is None else sum(r["down_parameters"] for r in rounds)
        down = max(sum(values) for values in zip(*(r["down"] for r in rounds)))
        everything = sum(sum(_up(r)) + sum(r["down"]) for r in rounds)
        rows.append([s["strategy"], s["group"], str(len(rounds)), span, *totals, _count(up_params),
                     f"{down:,}", _count(down_params), _count(s["final_download"]), f"{everything:,}"])
    return columns, rows


TRANSFER_NOTES = [
    "Bytes are sizes of real files: one-shot the client mask files as sent; iterative the files the file "
    "protocol sends (round L: `fedlib client-mask --round L` uploads a one-block mask file and downloads the "
    "global file of blocks < L, with its vote counts), written with fedlib's MaskWriter from the real client "
    "and global masks; FedSpaLLM its record's payload bytes (weights + masks), split evenly over clients.",
    "Per-client figures are the largest client's (client files differ by a few header bytes: id, sample count). "
    "Mask entries are the paper's unit (one parameter per mask entry, Table 3): one-shot uploads d, iterative "
    "uploads d too, but its downloads grow with the round (round L receives blocks < L: O(L^2) in total, "
    "vote counts included), where the paper counts d (a stateful client receiving only its round's block).",
    "Final global file: what a client downloads to build the pruned model at the end (not counted by the paper; "
    "'-' for FedSpaLLM, whose record does not count it).",
]


def write_transfer_table(strategies: Sequence[dict], context: dict, md: Path, csv_path: Path,
                         html: Path | None = None, record: Path | None = None) -> None:
    columns, rows = transfer_rows(strategies)
    lines = _context_lines(context) + TRANSFER_NOTES
    write_table(md, csv_path, "Table 3 analogue: upload and download per client", lines, columns, rows, html)
    if record is not None:
        write_text_atomic(record, json.dumps({"strategies": list(strategies)}, indent=1, sort_keys=True) + "\n")


def _context_lines(context: dict) -> list[str]:
    example = {"model_fingerprint": context.get("model_fingerprint", "?")}
    return provenance_lines(context, example, _NO_MEASURE)


@dataclass(frozen=True)
class _NoMeasure:
    @staticmethod
    def lines(_example) -> list[str]:
        return []


_NO_MEASURE = _NoMeasure()


# --------------------------------------------------------------------------- network model


@dataclass(frozen=True)
class NetworkProfile:
    """A client link (latency, uplink and downlink bandwidth) and the server's shared link."""

    name: str
    latency_s: float
    up_bps: float
    down_bps: float
    server_bps: float

    def describe(self) -> str:
        return f"{self.latency_s * 1000:g} ms, {_bps(self.up_bps)} up / {_bps(self.down_bps)} down"


def _bps(value: float) -> str:
    return f"{value / 1e9:g} Gbit/s" if value >= 1e9 else f"{value / 1e6:g} Mbit/s"


#: FedPrLLM App. D.2's four profiles, plus a mobile uplink (assumed: an LTE-class link, slower
#: up than down); the server sits on a 10 Gbit/s link (100 Gbit/s in the datacenter)
PROFILES = (
    NetworkProfile("Datacenter", 0.001, 10e9, 10e9, 100e9),
    NetworkProfile("Cross-silo LAN", 0.005, 1e9, 1e9, 10e9),
    NetworkProfile("Cross-silo WAN", 0.05, 100e6, 100e6, 10e9),
    NetworkProfile("Edge", 0.1, 10e6, 10e6, 10e9),
    NetworkProfile("Mobile uplink", 0.05, 5e6, 25e6, 10e9),
)
#: FedPrLLM App. D.3: 20 % of the clients at 50 % of their bandwidth
STRAGGLER_FRACTION = 0.2
STRAGGLER_SPEED = 0.5


def transfer_seconds(nbytes: float, bps: float, latency_s: float) -> float:
    """One transfer: latency plus serialization; nothing sent costs nothing."""
    return latency_s + nbytes * 8 / bps if nbytes > 0 else 0.0


def _phase(sizes: Sequence[float], client_bps: Sequence[float], profile: NetworkProfile) -> float:
    """Clients transfer in parallel on their own links; the server's link carries the sum."""
    clients = max((transfer_seconds(b, bps, profile.latency_s) for b, bps in zip(sizes, client_bps)), default=0.0)
    return max(clients, transfer_seconds(sum(sizes), profile.server_bps, profile.latency_s))


def straggler_count(n_clients: int, fraction: float = STRAGGLER_FRACTION) -> int:
    return round(fraction * n_clients)


def round_seconds(up: Sequence[float], down: Sequence[float], profile: NetworkProfile,
                  stragglers: int = 0, speed: float = STRAGGLER_SPEED) -> float:
    """A round's communication time: the upload phase, then the download phase (server compute
    not included); the first ``stragglers`` clients have ``speed`` times the bandwidth."""
    factor = [speed if i < stragglers else 1.0 for i in range(len(up))]
    return (_phase(up, [profile.up_bps * f for f in factor], profile)
            + _phase(down, [profile.down_bps * f for f in factor], profile))


def strategy_seconds(strategy: dict, profile: NetworkProfile, stragglers: int = 0) -> float:
    """Every round, one after another (what the paper's tables count)."""
    return sum(round_seconds(_up(r), r["down"], profile, stragglers) for r in strategy["rounds"])


def final_seconds(strategy: dict, profile: NetworkProfile, stragglers: int = 0) -> float | None:
    """The final global file to every client (None when the strategy's record lacks its size)."""
    if strategy["final_download"] is None:
        return None
    n = len(strategy["rounds"][0]["up"])
    return _phase([strategy["final_download"]] * n,
                  [profile.down_bps * (STRAGGLER_SPEED if i < stragglers else 1.0) for i in range(n)], profile)


def _seconds(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:,.1f}"


def network_rows(strategies: Sequence[dict], profiles: Sequence[NetworkProfile] = PROFILES
                 ) -> tuple[list[str], list[list[str]]]:
    columns = ["Network profile", "Client link", "Server link", "Strategy", "Rounds", "Time in rounds (s)",
               "With stragglers (s)", "Straggler penalty (s)", "× one-shot", "Final global file, with stragglers (s)"]
    rows = []
    for profile in profiles:
        first = None
        for s in strategies:
            n = len(s["rounds"][0]["up"])
            plain = strategy_seconds(s, profile)
            slow = strategy_seconds(s, profile, straggler_count(n))
            first = plain if first is None else first
            final = final_seconds(s, profile, straggler_count(n))
            rows.append([profile.name, profile.describe(), _bps(profile.server_bps), s["strategy"],
                         str(len(s["rounds"])), _seconds(plain), _seconds(slow), _seconds(slow - plain),
                         f"{plain / first:.1f}", "-" if final is None else _seconds(final)])
    return columns, rows


def network_notes(strategies: Sequence[dict]) -> list[str]:
    n = len(strategies[0]["rounds"][0]["up"])
    return [
        "Communication time only (no client or server compute: see the cost_time table), modelled over the "
        "measured bytes of the Table 3 analogue: a transfer takes latency + bytes × 8 / bandwidth; in a round "
        "every client uploads in parallel on its own link while the server's link carries the sum of the uploads "
        "(the phase ends with the slower of the two), then the same for the downloads. Rounds run one after another. "
        "The last column: every client then downloads the final global file (not in the round times, as in the "
        "paper; '-' where the record lacks its size).",
        f"Stragglers (FedPrLLM App. D.3): {straggler_count(n)} of {n} clients "
        f"({STRAGGLER_FRACTION:.0%}) at {STRAGGLER_SPEED:.0%} of the bandwidth, up and down; the penalty is "
        "paid in every round, so once by one-shot and once per block by iterative.",
        "Profiles: FedPrLLM App. D.2 (datacenter, cross-silo LAN and WAN, edge), plus a mobile uplink "
        "(an assumption: LTE-class, 5 Mbit/s up, 25 Mbit/s down). The server link (100 Gbit/s in the "
        "datacenter, else 10 Gbit/s) is an assumption too.",
    ]


def write_network_table(strategies: Sequence[dict], context: dict, md: Path, csv_path: Path,
                        html: Path | None = None) -> None:
    columns, rows = network_rows(strategies)
    write_table(md, csv_path, "Table 16 analogue: communication time under network profiles, with stragglers",
                _context_lines(context) + network_notes(strategies), columns, rows, html)


# --------------------------------------------------------------------------- time and memory


#: what Snakemake writes where it could not measure a job's memory (a job too short to sample)
UNMEASURED = ("-", "NA")


def read_benchmark(path: Path) -> dict[str, float | None]:
    """Seconds and peak resident memory (MB; None where Snakemake could not measure it) of a
    Snakemake ``benchmark:`` file (its last run)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: a Snakemake benchmark file has a header and a row; this one has no row")
    last = rows[-1]

    def number(column: str) -> float:
        try:
            return float(last.get(column))
        except (TypeError, ValueError):
            raise ValueError(f"{path}: field {column!r}: expected a number, got {last.get(column)!r}") from None

    return {"s": number("s"), "max_rss": None if last.get("max_rss") in UNMEASURED else number("max_rss")}


def _fmt_s(values: Sequence[float]) -> str:
    return "-" if not values else f"{statistics.mean(values):.1f}"


def time_rows(spec: Mapping) -> tuple[list[str], list[list[str]]]:
    """Rows of a spec ``{"rows": [{"cells", "client": [tsv], "server": [tsv]}]}``: client seconds
    (mean and max over the client jobs), server seconds (summed), peak memory over every job."""
    columns = list(spec["columns"]) + ["Client jobs", "Client time, mean (s)", "Client time, max (s)",
                                       "Server time (s)", "Peak memory (MB)"]
    rows = []
    for row in spec["rows"]:
        clients = [read_benchmark(Path(p)) for p in row.get("client", [])]
        server = [read_benchmark(Path(p)) for p in row.get("server", [])]
        seconds = [b["s"] for b in clients]
        measured = [b["max_rss"] for b in clients + server if b["max_rss"] is not None]
        rows.append(list(row["cells"]) + [
            str(len(clients)), _fmt_s(seconds), "-" if not seconds else f"{max(seconds):.1f}",
            "-" if not server else f"{sum(b['s'] for b in server):.1f}",
            f"{max(measured):,.0f}" if measured else "-"])
    return columns, rows


TIME_NOTES = [
    "Measurements (Snakemake benchmark: files of the jobs, wall-clock seconds and peak resident memory of each "
    "job's processes), not bit-identical across runs: this table is the named target cost_time, not part of "
    "`make run`'s results.",
    "Clients run one after another on this machine (jobs in parallel share its cores); a federation runs them "
    "in parallel, so its client phase takes the max, not the sum. Simulated strategies (iterative, FedSpaLLM) "
    "run every client and the server in one job: their time is in the server column.",
]


def write_time_table(spec: Mapping, context: dict, md: Path, csv_path: Path, html: Path | None = None) -> None:
    columns, rows = time_rows(spec)
    write_table(md, csv_path, "Table 15 analogue: client time, server time and peak memory per strategy",
                _context_lines(context) + TIME_NOTES, columns, rows, html)


# --------------------------------------------------------------------------- the workflow's files


def transfer_inputs(catalog) -> dict:
    """The default setting's one-shot client files and the global file of the first server group
    (``fedlib.catalog.Catalog``; the workflow's cost rules)."""
    from fedlib.catalog.variants import Variant

    calib, split, prune = catalog.setting()
    group = catalog.config["server"]["groups"][0]
    label = Variant.fedprllm("oneshot", group, False).label
    return {"clients": catalog.client_masks(calib, split, prune),
            "glob": catalog.variant_source(calib, split, prune, label)[0]}


def fedspallm_record(catalog) -> str:
    """The FedSpaLLM record of the setting with the default experiment's number of clients."""
    from fedlib.catalog.variants import Split

    calib, split, prune = catalog.fedspallm_setting(Split.parse(catalog.setting()[1]).clients)
    return f"{catalog.results}/fedspallm/{calib}/{split}/{prune}/rounds.json"


def time_spec(catalog, bench: str) -> dict:
    """The cost_time table's spec: the default setting's jobs' benchmark files under ``bench``
    (Centralized, Local-only = the client jobs, FedPrLLM one-shot per server group, and the
    simulated iterative runs when server.schedules has them)."""
    from fedlib.catalog.variants import Split, Variant

    calib, split, prune = catalog.setting()
    where = f"{calib}/{split}/{prune}"
    clients = [f"{bench}/client_mask/{where}/{i}.tsv" for i in range(Split.parse(split).clients)]
    rows = [{"cells": ["Centralized", "-", "-"], "client": [f"{bench}/centralized_mask/{calib}/{prune}.tsv"]},
            {"cells": ["Local-only", "-", "-"], "client": clients}]
    server = catalog.config["server"]
    schedules = server.get("schedules", ["oneshot"])
    for group in server["groups"]:
        stem = Variant.fedprllm("oneshot", group, False).global_stem
        rows.append({"cells": ["FedPrLLM", group.capitalize(), "One-shot"], "client": clients,
                     "server": [f"{bench}/aggregate/{where}/{stem}.tsv"]})
    if "iterative" in schedules:
        for scaled in server["scaling"]:
            for group in server["groups"]:
                stem = Variant.fedprllm("iterative", group, scaled).global_stem
                rows.append({"cells": ["FedPrLLM", group.capitalize(), "Iterative" + (" (scaled)" if scaled else "")],
                             "server": [f"{bench}/iterative/{where}/{stem}.tsv"]})
    return {"columns": ["Method", "Server group", "Pruning strategy"], "rows": rows}


def time_inputs(spec: Mapping) -> list[str]:
    return sorted({p for row in spec["rows"] for key in ("client", "server") for p in row.get(key, [])})
