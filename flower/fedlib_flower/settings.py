"""The coordinator's run configuration (``[tool.flwr.app.config]`` of flower/pyproject.toml,
overridden with ``flwr run ... --run-config``), checked, and the round plan sent to the sites."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from fedlib.server import STRATEGIES, FedPrLLM, FedSpaLLM
from fedlib_flower.transfer import MAX_CHUNK, MIN_CHUNK


@dataclass(frozen=True)
class Settings:
    #: the coordinator's copy of the public model (its fingerprint, layers and, for mask format
    #: version 2, the weights the uploads are coded against)
    model: str
    #: the coordinator's folder: every upload as it arrives, each round's global file, federation.json
    out: str
    #: the roster (:mod:`fedlib_flower.roster`): each site's Ed25519 public key -> its client id
    roster: str = ""
    strategy: str = "fedprllm"
    #: fedprllm: one-shot or iterative
    mode: str = "one-shot"
    #: the server's comparison group (fedspallm: the expansion group)
    group: str = "layer"
    sparsity: float = 0.5
    seed: int = 0
    #: the sites' local method and comparison group (fedspallm: sparsegpt_update by default)
    method: str = "wanda"
    local_group: str = "row"
    method_options: str = "{}"
    #: mask file format of the uploads (fedprllm): 1 packed bits, 2 coded against the model
    format_version: int = 1
    #: iterative fedprllm: sites continue from the scaled global blocks (they then get the earlier
    #: rounds' vote counts; without it, the masks alone)
    scale: bool = False
    batch_size: int = 8
    #: fedspallm: rounds T, per-site fractions of the blocks per round (space separated, in the
    #: order of the sites' client ids; empty: every site prunes every block), sampler
    rounds: int = 1
    resources: str = ""
    sampler: str = "cyclic"
    weight_dtype: str = "float16"
    #: fedprllm: secure aggregation of the votes (the coordinator never holds a site's mask)
    secagg: bool = False
    #: its Shamir threshold t (0: floor(n/2) + 1, n the roster's sites; the sites refuse less)
    secagg_threshold: int = 0
    #: start once this many sites are connected (waiting at most connect_timeout seconds)
    min_clients: int = 2
    connect_timeout: float = 600.0
    #: a round closes this many seconds after it starts, with the sites that answered
    round_deadline: float = 3600.0
    #: at most this many sites compute at once (0: all; a localhost benchmark limits it)
    max_parallel: int = 0
    #: uploads come in chunks of at most this many bytes (:mod:`fedlib_flower.transfer`): what
    #: the coordinator holds of a reply at a time; each chunk is one more message (a ClientApp
    #: process at the site)
    chunk_bytes: int = 4 << 20

    @classmethod
    def from_run_config(cls, run_config) -> "Settings":
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ValueError(f"run config: unknown key {unknown[0]!r}; keys: {sorted(known)}")
        values = {}
        for key, value in run_config.items():
            f = known[key]
            kind = {"str": str, "int": int, "float": float, "bool": bool}[f.type]
            if kind is float and type(value) is int:
                value = float(value)
            if type(value) is not kind:
                raise ValueError(f"run config: key {key!r}: expected {f.type}, got {value!r}")
            values[f.name] = value
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        for key in ("model", "out", "roster"):
            if not getattr(self, key):
                raise ValueError(f"run config: key {key!r}: give the coordinator's {key} "
                                 f"{'file' if key == 'roster' else 'folder'}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"run config: key 'strategy': expected one of {sorted(STRATEGIES)}, got {self.strategy!r}")
        json.loads(self.method_options)
        if self.secagg and self.strategy != "fedprllm":
            raise ValueError("run config: key 'secagg': secure aggregation sums FedPrLLM's votes (strategy fedprllm)")
        if self.secagg and self.format_version != 1:
            raise ValueError("run config: key 'format-version': with secagg the sites upload masked words, not files")
        if self.secagg and self.scale and self.mode == "iterative" and self.min_clients < 3:
            raise ValueError("run config: key 'min-clients': iterative secagg with scale sends the sites the earlier "
                             "rounds' vote counts, which give 2 sites each other's masks: min-clients >= 3 (each "
                             "site then learns the sum of the others' masks of the settled blocks)")
        if self.min_clients < 1 or self.round_deadline <= 0 or self.max_parallel < 0:
            raise ValueError("run config: min-clients >= 1, round-deadline > 0 and max-parallel >= 0")
        if not MIN_CHUNK <= self.chunk_bytes <= MAX_CHUNK:
            raise ValueError(f"run config: key 'chunk-bytes': {self.chunk_bytes}, a site serves chunks of "
                             f"{MIN_CHUNK} to {MAX_CHUNK} bytes")
        self.server()  # the strategy checks its own options

    def server(self, n_clients: int | None = None):
        """The fedlib server strategy of this federation."""
        if self.strategy == "fedprllm":
            return FedPrLLM(group=self.group, sparsity=self.sparsity, seed=self.seed, mode=self.mode)
        resources = tuple(float(r) for r in self.resources.split()) or None
        if resources is not None and n_clients is not None and len(resources) != n_clients:
            raise ValueError(f"run config: key 'resources': {len(resources)} values for {n_clients} sites")
        return FedSpaLLM(group=self.group, sparsity=self.sparsity, seed=self.seed, rounds=self.rounds,
                         resources=resources if n_clients is not None else None, sampler=self.sampler,
                         method=self.client_method, weight_dtype=self.weight_dtype)

    @property
    def client_method(self) -> str:
        """The sites' method: FedSpaLLM's default is SparseGPT with its update."""
        return "sparsegpt_update" if self.strategy == "fedspallm" and self.method == "wanda" else self.method

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def digest_fields(self) -> dict:
        """What decides the federation's result (a resumed federation must agree on all of it);
        deadlines, waiting, parallelism, the chunk size and where the roster is do not (who took part is checked
        by id)."""
        skip = {"connect_timeout", "round_deadline", "max_parallel", "min_clients", "roster", "chunk_bytes"}
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def plan(self, round_index: int) -> dict:
        """The round plan every site gets in ``train.mask`` / ``train.weights`` (a ConfigRecord)."""
        return {"round": round_index, "mode": self.mode if self.strategy == "fedprllm" else "fedspallm",
                "method": self.client_method, "sparsity": self.sparsity, "group": self.local_group,
                "seed": self.seed, "batch-size": self.batch_size, "method-options": self.method_options,
                "format-version": self.format_version, "scale": self.scale, "weight-dtype": self.weight_dtype}


#: the plan's keys and types, as the sites check them
PLAN = {"round": int, "mode": str, "method": str, "sparsity": float, "group": str, "seed": int, "batch-size": int,
        "method-options": str, "format-version": int, "scale": bool, "weight-dtype": str}
