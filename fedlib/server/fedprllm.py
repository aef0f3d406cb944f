"""FedPrLLM server: sum the client masks, keep the top-k most-voted per comparison group.

M_hat = sum_i M_i counts, per weight, the clients that want it pruned; the global mask prunes
the k weights with the most votes in each group (layer / row / column / N:M), ties broken by
seeded keys (the reference breaks layer ties randomly and row/column ties by index; a seeded
random order is deterministic and unbiased). Optional weight scaling multiplies surviving
weights by (m - M_hat) / m at application time, so the global file keeps the vote counts.

The aggregation streams over layers: at any time it holds one layer's counts plus one
client's bits of that layer, whatever the number of clients, and writes each layer's global
mask and counts to the output as it goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fedlib.groups import prune_lowest
from fedlib.maskfile import MaskFile, MaskFileError, MaskWriter
from fedlib.models import LayerInfo


#: what every client of one aggregation must have in common (the model fingerprint and layers
#: are checked against the server's model when each file is opened)
COHORT_FIELDS = ("method", "group", "sparsity", "allocation")


def global_mask_from_votes(votes: torch.Tensor, sparsity: float, group: str, seed: int, name: str) -> torch.Tensor:
    """Prune the most-voted weights: lowest of -votes within each group."""
    return prune_lowest(-votes.to(torch.float32), sparsity, group, seed, f"server:{name}")


def planned_sparsity(votes: torch.Tensor, n_clients: int) -> float:
    """A layer's server target when clients allocate sparsity per layer (OWL, BESA): the mean of
    the clients' pruned fractions, sum(votes) / (n * numel). The papers are silent here; a
    uniform server target would discard the allocation the local method planned."""
    return float(votes.sum(dtype=torch.int64)) / (n_clients * votes.numel())


def scale_factors(votes: torch.Tensor, n_clients: int) -> torch.Tensor:
    """(m - M_hat) / m: the FedAvg of the clients' locally pruned weights, relative to W."""
    return (n_clients - votes.to(torch.float32)) / n_clients


@dataclass
class FedPrLLM:
    """The server strategy: ``configure`` says what clients must send, ``aggregate`` turns
    their mask files into the global mask file."""

    group: str = "layer"
    sparsity: float = 0.5
    seed: int = 0

    def configure(self) -> dict:
        return {"sparsity": self.sparsity, "seed": self.seed, "send": "mask"}

    def open_clients(self, paths: Sequence[Path], fingerprint: str, layers: Sequence[LayerInfo]) -> list[MaskFile]:
        files = [MaskFile(p, fingerprint, layers) for p in paths]
        if not files:
            raise ValueError("aggregate needs at least one client mask file")
        seen: dict[str, Path] = {}
        for f in files:
            if f.header.role != "client":
                raise MaskFileError(f.path, "role", f"expected 'client', got {f.header.role!r}")
            if f.header.client_id in seen:
                raise MaskFileError(f.path, "client_id", f"{f.header.client_id!r} also sent {seen[f.header.client_id]}")
            seen[f.header.client_id] = f.path
        first = files[0].header
        for f in files[1:]:
            for name in COHORT_FIELDS:
                if getattr(f.header, name) != getattr(first, name):
                    raise MaskFileError(
                        f.path, name, f"{getattr(f.header, name)!r}, but {first.path} has {getattr(first, name)!r}: "
                        f"the clients of one aggregation agree on {', '.join(COHORT_FIELDS)}")
        return files

    def aggregate(self, paths: Sequence[Path], fingerprint: str, layers: Sequence[LayerInfo], out: Path) -> dict:
        files = self.open_clients(paths, fingerprint, layers)
        first = files[0].header
        # clients with a per-layer allocation (OWL, BESA): the server follows the clients' plan
        allocation = first.allocation
        # one layer at a time, from the clients' files to the global file
        with MaskWriter(
            out, layers, fingerprint=fingerprint, role="global", client_id="server",
            method=f"fedprllm[{first.method}]", group=self.group, sparsity=self.sparsity, allocation=allocation,
            n_samples=sum(f.header.n_samples for f in files), seed=self.seed, n_clients=len(files), votes=True,
        ) as writer:
            for info in layers:
                count = torch.zeros(info.shape, dtype=torch.int16)
                for f in files:
                    count += f.layer_mask(info.name)
                target = planned_sparsity(count, len(files)) if allocation == "nonuniform" else self.sparsity
                writer.add(info.name, global_mask_from_votes(count, target, self.group, self.seed, info.name), count)
        return {"n_clients": len(files), "group": self.group, "sparsity": self.sparsity, "allocation": allocation}
