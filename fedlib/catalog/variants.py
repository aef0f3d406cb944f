"""What the workflow evaluates, named: the variant label grammar and the setting path components.

A result file is ``{results}/eval/{calib}/{split}/{prune}/{label}.json`` (``eval/dense.json`` for
the dense model). The three setting components and the label each have one grammar here, used by
the Snakemake rules (wildcard constraints, inputs, CLI arguments) and by the table specs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: comparison group as spelled in paths (2of4 is the CLI's 2:4)
GROUP_PATTERN = r"row|layer|column|\d+of\d+"
#: FedPrLLM's schedules as labels and paths spell them: one round over every block, one round per block
SCHEDULES = ("oneshot", "iterative")

#: labels of variants scored under a setting (every label but dense, which has its own rule/path)
SETTING_LABEL_PATTERN = (
    r"centralized|local_\d+|random|fedspallm|standalone_\d+"
    rf"|fedprllm_({'|'.join(SCHEDULES)})_({GROUP_PATTERN})_(scale|noscale)"
)
LABEL_PATTERN = rf"dense|{SETTING_LABEL_PATTERN}"
LABEL_GRAMMAR = ("dense | centralized | local_<i> | random | fedspallm | standalone_<i> | "
                 "fedprllm_<oneshot|iterative>_<row|layer|column|NofM>_<scale|noscale>")

CALIB_PATTERN = r"(c4|wikitext2|ptb|mix)-\d+x\d+(-seed\d+)?"
SPLIT_PATTERN = r"(iid|dir[0-9.]+)-\d+"
PRUNE_PATTERN = rf"[a-z_]+-[0-9.]+-({GROUP_PATTERN})"


def group_arg(group: str) -> str:
    """Path spelling -> CLI spelling of a comparison group (2of4 -> 2:4)."""
    return group.replace("of", ":")


def group_path(group: str) -> str:
    """CLI/config spelling -> path spelling of a comparison group (2:4 -> 2of4)."""
    return group.replace(":", "of")


def _parse(kind: str, pattern: str, text: str, grammar: str) -> None:
    if not isinstance(text, str) or not re.fullmatch(pattern, text):
        raise ValueError(f"invalid {kind} {text!r}: expected {grammar}")


@dataclass(frozen=True)
class Calib:
    """``{dataset}-{nsamples}x{seqlen}``, e.g. c4-32x512; mix-8x512 is 8 samples from each of
    WikiText-2, C4 and PTB (the non-IID pool). ``-seed{n}`` (c4-32x512-seed1) is another
    calibration draw: the pool is sampled and split over the clients with seed n instead of the
    config's seed (target table1_seeds); without it, the config's seed."""

    dataset: str
    nsamples: int
    seqlen: int
    seed: int | None = None

    @classmethod
    def parse(cls, text: str) -> Calib:
        _parse("calibration component", CALIB_PATTERN, text, "{c4|wikitext2|ptb|mix}-{nsamples}x{seqlen}[-seed{n}]")
        dataset, size, *seed = text.split("-")
        nsamples, seqlen = size.split("x")
        return cls(dataset, int(nsamples), int(seqlen), int(seed[0].removeprefix("seed")) if seed else None)

    def draw_seed(self, config_seed: int) -> int:
        """The seed that samples this pool and splits it over the clients."""
        return config_seed if self.seed is None else self.seed

    def __str__(self) -> str:
        return f"{self.dataset}-{self.nsamples}x{self.seqlen}" + ("" if self.seed is None else f"-seed{self.seed}")


@dataclass(frozen=True)
class Split:
    """``iid-{clients}`` or ``dir{alpha}-{clients}`` (Dirichlet(alpha) per source), e.g. dir5-12."""

    partition: str  # iid or dir{alpha}: the CLI's --partition
    clients: int

    @classmethod
    def parse(cls, text: str) -> Split:
        _parse("split component", SPLIT_PATTERN, text, "iid-{clients} or dir{alpha}-{clients}")
        partition, clients = text.split("-")
        return cls(partition, int(clients))

    def describe(self) -> str:
        return "IID" if self.partition == "iid" else f"Dirichlet(alpha={self.partition[3:]})"

    def __str__(self) -> str:
        return f"{self.partition}-{self.clients}"


@dataclass(frozen=True)
class Prune:
    """``{method}-{sparsity}-{local group}``, e.g. wanda-0.5-row, wanda-0.5-2of4 (group in path spelling)."""

    method: str
    sparsity: float
    group: str

    @classmethod
    def parse(cls, text: str) -> Prune:
        _parse("prune component", PRUNE_PATTERN, text, "{method}-{sparsity}-{row|layer|column|NofM}")
        method, sparsity, group = text.split("-")
        return cls(method, float(sparsity), group)

    def __str__(self) -> str:
        return f"{self.method}-{self.sparsity}-{self.group}"


@dataclass(frozen=True)
class Variant:
    """One evaluated model: ``kind`` is dense, centralized, local (client ``client``'s own mask),
    random, fedspallm, standalone (client ``client``'s FedSpaLLM model) or fedprllm (server
    ``schedule`` with comparison ``group`` in path spelling, ``scale`` = weight scaling)."""

    kind: str
    client: int | None = None
    schedule: str | None = None
    group: str | None = None
    scale: bool | None = None

    @classmethod
    def from_label(cls, label: str) -> Variant:
        if not isinstance(label, str) or not re.fullmatch(LABEL_PATTERN, label):
            raise ValueError(f"invalid variant label {label!r}: expected {LABEL_GRAMMAR}")
        if label.startswith(("local_", "standalone_")):
            kind, client = label.split("_")
            return cls(kind, client=int(client))
        if label.startswith("fedprllm_"):
            _, schedule, group, scale = label.split("_")
            return cls("fedprllm", schedule=schedule, group=group, scale=scale == "scale")
        return cls(label)

    @classmethod
    def fedprllm(cls, schedule: str, group: str, scale: bool) -> Variant:
        """A FedPrLLM variant; ``group`` in either spelling (2:4 or 2of4)."""
        return cls("fedprllm", schedule=schedule, group=group_path(group), scale=bool(scale))

    def __post_init__(self):
        per_client = self.kind in ("local", "standalone")
        fedprllm = self.kind == "fedprllm"
        valid = (
            self.kind in ("dense", "centralized", "random", "fedspallm", "local", "standalone", "fedprllm")
            and (isinstance(self.client, int) and self.client >= 0 if per_client else self.client is None)
            and ((self.schedule in SCHEDULES and isinstance(self.group, str)
                  and re.fullmatch(GROUP_PATTERN, self.group) is not None and isinstance(self.scale, bool))
                 if fedprllm else (self.schedule, self.group, self.scale) == (None, None, None))
        )
        if not valid:
            raise ValueError(f"invalid variant {self!r}: labels are {LABEL_GRAMMAR}")

    @property
    def label(self) -> str:
        if self.kind in ("local", "standalone"):
            return f"{self.kind}_{self.client}"
        if self.kind == "fedprllm":
            return f"fedprllm_{self.schedule}_{self.group}_{'scale' if self.scale else 'noscale'}"
        return self.kind

    def to_label(self) -> str:
        return self.label

    def __str__(self) -> str:
        return self.label

    @property
    def row_kind(self) -> str:
        """dense, centralized, local_only, fedprllm_noscale, fedprllm_scale, ... (zeroshot.run_rows)."""
        if self.kind == "local":
            return "local_only"
        if self.kind == "fedprllm":
            return f"fedprllm_{'scale' if self.scale else 'noscale'}"
        return self.label

    @property
    def name(self) -> str:
        """fedprllm_oneshot_layer_scale -> FedPrLLM (layer, one-shot, scaling)"""
        if self.kind != "fedprllm":
            raise ValueError(f"variant {self.label} has no FedPrLLM name")
        schedule = "one-shot" if self.schedule == "oneshot" else "iterative"
        return f"FedPrLLM ({group_arg(self.group)}, {schedule}" + (", scaling)" if self.scale else ")")

    @property
    def cells(self) -> list[str]:
        """A FedPrLLM row's cells: method, server comparison group, schedule (the papers' "pruning
        strategy"), weight scaling."""
        if self.kind != "fedprllm":
            raise ValueError(f"variant {self.label} has no FedPrLLM cells")
        return ["FedPrLLM", group_arg(self.group).capitalize(),
                "One-shot" if self.schedule == "oneshot" else "Iterative", "✓" if self.scale else "✗"]

    @property
    def global_stem(self) -> str:
        """A FedPrLLM variant's global mask file under ``{results}/global/{calib}/{split}/{prune}/``,
        without ``.mask.safetensors``: ``{strategy}_{run}_{group}``, the strategy of
        :data:`fedlib.server.STRATEGIES` that wrote it, then its run: one-shot scaling is applied
        when the model is evaluated, but iterative pruning with scaling propagates through scaled
        blocks, a run of its own (``iterative-scaled``)."""
        if self.kind != "fedprllm":
            raise ValueError(f"variant {self.label} has no global mask file")
        run = f"{self.schedule}-scaled" if self.schedule == "iterative" and self.scale else self.schedule
        return f"{self.kind}_{run}_{self.group}"

    def eval_path(self, results: str, calib: str, split: str, prune: str, measure: str = "eval") -> str:
        """Its result file under ``{results}/{measure}/`` (eval: perplexity, zeroshot: accuracy)."""
        if self.kind == "dense":
            return f"{results}/{measure}/dense.json"
        return f"{results}/{measure}/{calib}/{split}/{prune}/{self.label}.json"

    def source(self, results: str, calib: str, split: str, prune: str) -> tuple[str | None, str]:
        """(file the variant needs, its `fedlib evaluate` / `fedlib zeroshot` arguments).

        FedPrLLM variants are the base model plus a mask file; FedSpaLLM variants load a weight
        file (the aggregated global model, or a client's own Standalone model)."""
        base = f"{calib}/{split}/{prune}"
        if self.kind == "dense":
            return None, ""
        if self.kind in ("fedspallm", "standalone"):
            name = "global" if self.kind == "fedspallm" else self.label
            path = f"{results}/fedspallm/{base}/{name}.weights.safetensors"
            return path, f"--weights {path}"
        if self.kind == "centralized":
            path = f"{results}/masks/{calib}/central/{prune}/centralized.mask.safetensors"
        elif self.kind == "local":
            path = f"{results}/masks/{base}/client_{self.client}.mask.safetensors"
        elif self.kind == "random":
            path = f"{results}/random/{Prune.parse(prune).sparsity}.mask.safetensors"
        else:
            path = f"{results}/global/{base}/{self.global_stem}.mask.safetensors"
            return path, f"--mask {path}" + (" --scale" if self.scale else "")
        return path, f"--mask {path}"
