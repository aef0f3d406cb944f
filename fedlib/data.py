"""Datasets, token windows and client partitions.

Offline, datasets come from a folder laid out like ``../shared/data`` (``data_dir``):
``wikitext2/{test,validation}.txt``, ``ptb/{train,validation,test}.txt``, ``c4/train.jsonl``
(the layout and the splits read offline: :mod:`fedlib.mirror`).
Online (``data_dir`` is None) the same datasets come from the Hugging Face hub.

Token files (calibration pools, client shards, evaluation windows) are safetensors with one
int32 tensor ``input_ids`` of shape (n, seqlen) and string metadata saying where they came from.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from fedlib.io import write_safetensors
from fedlib.mirror import CALIBRATION_SPLIT, EVALUATION_SPLIT, MIXTURE_DATASETS, mirror_path

TEXT_DATASETS = ("wikitext2", "ptb", "c4")

#: Offline, the mirror has no C4 validation split: held-out C4 documents stand in for it.
C4_HELDOUT_NOTE = "C4 = held-out documents of c4/train.jsonl that calibration never sees"


class DataError(ValueError):
    pass


# --------------------------------------------------------------------------- raw text


def _mirror_file(data_dir: Path, dataset: str, split: str) -> Path:
    path = mirror_path(data_dir, dataset, split)
    if not path.is_file():
        raise DataError(
            f"{dataset} {split}: expected {path} (data_dir={data_dir}); "
            f"point data_dir at a folder laid out like shared/data, or set it to null for the hub"
        )
    return path


def wikitext2_rows(data_dir: Path | None, split: str) -> list[str]:
    """Rows as the HF dataset ``wikitext-2-raw-v1`` has them (blank lines are "")."""
    if data_dir is None:
        from datasets import load_dataset

        return list(load_dataset("wikitext", "wikitext-2-raw-v1", split=split)["text"])
    text = _mirror_file(data_dir, "wikitext2", split).read_text(encoding="utf-8")
    return [line if line.strip() else "" for line in text.splitlines(keepends=True)]


def ptb_rows(data_dir: Path | None, split: str) -> list[str]:
    """Sentences as ``ptb_text_only`` has them (stripped lines)."""
    if data_dir is None:
        from datasets import load_dataset

        return list(load_dataset("ptb_text_only", "penn_treebank", split=split)["sentence"])
    text = _mirror_file(data_dir, "ptb", split).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines()]


def c4_documents(data_dir: Path | None, split: str = "train") -> list[str]:
    if data_dir is None:
        from datasets import load_dataset

        files = {
            "train": "en/c4-train.00000-of-01024.json.gz",
            "validation": "en/c4-validation.00000-of-00008.json.gz",
        }
        return list(load_dataset("allenai/c4", data_files={split: files[split]}, split=split)["text"])
    path = _mirror_file(data_dir, "c4", split)
    docs = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                docs.append(json.loads(line)["text"])
            except (json.JSONDecodeError, KeyError) as err:
                raise DataError(f"{path}:{number}: expected a JSON object with a 'text' field ({err})") from None
    return docs


def _doc_slice(docs: list[str], docs_range: tuple[int, int] | None, what: str) -> list[str]:
    if docs_range is None:
        return docs
    start, stop = docs_range
    if not 0 <= start < stop <= len(docs):
        raise DataError(f"{what}: document range [{start}, {stop}) is outside 0..{len(docs)}")
    return docs[start:stop]


# --------------------------------------------------------------------------- calibration


def calibration_windows(
    tokenizer,
    dataset: str,
    data_dir: Path | None,
    nsamples: int,
    seqlen: int,
    seed: int,
    docs_range: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``nsamples`` random windows of ``seqlen`` tokens, as Wanda/SparseGPT sample calibration
    data: pick a random document long enough, then a random window inside it (seeded).

    For C4, ``docs_range`` restricts the documents (offline, calibration uses the first
    documents and C4 evaluation the rest). For WikiText-2 and PTB the train split is one
    long text; offline WikiText-2 has no train split, so its validation split is used.
    """
    rng = random.Random(seed)
    if dataset not in TEXT_DATASETS:
        raise DataError(f"unknown calibration dataset {dataset!r}; known: {TEXT_DATASETS}")
    split = "train" if data_dir is None else CALIBRATION_SPLIT[dataset]
    if dataset == "c4":
        docs = _doc_slice(c4_documents(data_dir, split), docs_range, "c4 calibration")
        return _windows_from_documents(tokenizer, docs, nsamples, seqlen, rng, "c4")
    ids = tokenizer(_long_text(dataset, data_dir, split), return_tensors="pt").input_ids[0]
    if ids.numel() <= seqlen:
        raise DataError(f"{dataset}: {ids.numel()} tokens, fewer than one window of {seqlen}")
    starts = [rng.randint(0, ids.numel() - seqlen - 1) for _ in range(nsamples)]
    return torch.stack([ids[s : s + seqlen] for s in starts]).to(torch.int32)


def _long_text(dataset: str, data_dir: Path | None, split: str) -> str:
    """WikiText-2's or PTB's split as the one long text calibration cuts windows from."""
    if dataset == "wikitext2":
        return "\n\n".join(wikitext2_rows(data_dir, split))
    return " ".join(ptb_rows(data_dir, split))


def unit_windows(
    tokenizer,
    dataset: str,
    data_dir: Path | None,
    nsamples: int,
    seqlen: int,
    seed: int,
    unit: str,
    windows_per_unit: int,
    docs_range: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """``nsamples`` windows of ``seqlen`` tokens cut for a DP release (:mod:`fedlib.dp.unit`):
    no token in two windows, and at most ``windows_per_unit`` windows of one unit. Returns the
    windows and each one's unit (an index into the units of the text).

    ``document`` (C4 documents; WikiText-2 articles, split at their `` = Title = `` headings):
    documents in a seeded random order, each cut into its disjoint windows, of which up to
    ``windows_per_unit`` are drawn. ``span`` (PTB, WikiText-2 as one text): the text cut into
    disjoint windows, spans of ``windows_per_unit`` consecutive ones, ``nsamples`` windows
    drawn without replacement."""
    from fedlib.dp.unit import DOCUMENT, SPAN

    rng = random.Random(seed)
    if windows_per_unit < 1:
        raise DataError(f"windows per unit must be >= 1, got {windows_per_unit}")
    split = "train" if data_dir is None else CALIBRATION_SPLIT[dataset]
    if unit == SPAN:
        if dataset == "c4":
            raise DataError("c4 is documents: protect them with unit 'document', not 'span'")
        ids = tokenizer(_long_text(dataset, data_dir, split), return_tensors="pt").input_ids[0]
        count = ids.numel() // seqlen
        if nsamples > count:
            raise DataError(f"{dataset}: {count} disjoint windows of {seqlen} tokens, fewer than {nsamples}")
        picks = rng.sample(range(count), nsamples)
        return (torch.stack([ids[w * seqlen:(w + 1) * seqlen] for w in picks]).to(torch.int32),
                [w // windows_per_unit for w in picks])
    if unit != DOCUMENT:
        raise DataError(f"unit {unit!r}: a text is cut by 'document' or 'span'")
    if dataset == "c4":
        docs = _doc_slice(c4_documents(data_dir, split), docs_range, "c4 calibration")
    elif dataset == "wikitext2":
        docs = wikitext2_articles(wikitext2_rows(data_dir, split))
    else:
        raise DataError(f"{dataset} has no documents: protect disjoint spans of it (unit 'span')")
    windows, units = [], []
    for index in rng.sample(range(len(docs)), len(docs)):
        ids = tokenizer(docs[index], return_tensors="pt").input_ids[0]
        count = ids.numel() // seqlen
        for w in rng.sample(range(count), min(count, windows_per_unit, nsamples - len(windows))):
            windows.append(ids[w * seqlen:(w + 1) * seqlen])
            units.append(index)
        if len(windows) == nsamples:
            return torch.stack(windows).to(torch.int32), units
    raise DataError(f"{dataset}: {len(docs)} documents give {len(windows)} disjoint windows of {seqlen} tokens at "
                    f"{windows_per_unit} per document, fewer than {nsamples}")


def wikitext2_articles(rows: list[str]) -> list[str]:
    """WikiText-2's articles: the rows from one top-level `` = Title = `` heading to the next,
    joined as :func:`calibration_windows` joins the whole text."""
    articles: list[list[str]] = []
    for row in rows:
        if re.fullmatch(r" = [^=].* = \n?", row) or not articles:
            articles.append([])
        articles[-1].append(row)
    return ["\n\n".join(article) for article in articles]


def _windows_from_documents(tokenizer, docs, nsamples, seqlen, rng, what) -> torch.Tensor:
    windows = []
    tokenized: dict[int, torch.Tensor] = {}
    long_enough = None
    while len(windows) < nsamples:
        index = rng.randint(0, len(docs) - 1)
        if index not in tokenized:
            tokenized[index] = tokenizer(docs[index], return_tensors="pt").input_ids[0]
        ids = tokenized[index]
        if ids.numel() <= seqlen:
            if long_enough is None:
                # fail clearly instead of looping forever when no document is long enough
                long_enough = any(
                    tokenizer(d, return_tensors="pt").input_ids.shape[1] > seqlen for d in docs
                )
                if not long_enough:
                    raise DataError(f"{what}: no document has more than {seqlen} tokens")
            continue
        start = rng.randint(0, ids.numel() - seqlen - 1)
        windows.append(ids[start : start + seqlen])
    return torch.stack(windows).to(torch.int32)


# --------------------------------------------------------------------------- evaluation


def evaluation_text(dataset: str, data_dir: Path | None, c4_docs: tuple[int, int] | None,
                    split: str | None = None) -> str:
    """The evaluation text, joined as Wanda/SparseGPT join it: the dataset's evaluation split, or
    ``split`` (``validation``: held out from the test split, for choosing settings)."""
    if dataset not in TEXT_DATASETS:
        raise DataError(f"unknown evaluation dataset {dataset!r}; known: {TEXT_DATASETS}")
    if split is not None and dataset == "c4":
        raise DataError("c4: its evaluation text is held-out documents (c4_docs), not a split")
    if dataset == "c4" and data_dir is None:
        return " ".join(c4_documents(None, "validation")[:1100])
    split = split or ("test" if data_dir is None else EVALUATION_SPLIT[dataset])
    if dataset == "wikitext2":
        return "\n\n".join(wikitext2_rows(data_dir, split))
    if dataset == "ptb":
        return " ".join(ptb_rows(data_dir, split))
    return " ".join(_doc_slice(c4_documents(data_dir, split), c4_docs, "c4 evaluation"))


def evaluation_windows(
    tokenizer,
    dataset: str,
    data_dir: Path | None,
    seqlen: int,
    max_windows: int | None = None,
    c4_docs: tuple[int, int] | None = None,
    split: str | None = None,
) -> tuple[torch.Tensor, int]:
    """Non-overlapping ``seqlen`` windows of the evaluation text (:func:`evaluation_text`), and
    how many there are in all.

    With ``max_windows`` set, that many windows evenly spaced over the whole text (not just
    its first articles), always the same ones.
    """
    ids = tokenizer(evaluation_text(dataset, data_dir, c4_docs, split), return_tensors="pt").input_ids[0]
    total = ids.numel() // seqlen
    if total == 0:
        raise DataError(f"{dataset}: {ids.numel()} tokens, fewer than one window of {seqlen}")
    windows = ids[: total * seqlen].reshape(total, seqlen)
    if max_windows is not None and max_windows < total:
        picks = np.linspace(0, total - 1, max_windows).round().astype(int)
        windows = windows[torch.as_tensor(picks)]
    return windows.to(torch.int32), total


# --------------------------------------------------------------------------- partitions


def unit_partition(units: list[int], n_clients: int, seed: int) -> list[list[int]]:
    """Rows of a pool cut by unit (:func:`unit_windows`) over clients, whole units IID: one
    unit's windows go to one client, so no unit is in two clients' releases."""
    distinct = list(dict.fromkeys(units))
    owner = {}
    for client, members in enumerate(iid_partition(len(distinct), n_clients, seed)):
        for i in members:
            owner[distinct[i]] = client
    return [[row for row, u in enumerate(units) if owner[u] == client] for client in range(n_clients)]


def iid_partition(n_items: int, n_clients: int, seed: int) -> list[list[int]]:
    """Shuffle (seeded) and deal into ``n_clients`` parts whose sizes differ by at most one."""
    if n_clients < 1 or n_clients > n_items:
        raise DataError(f"cannot split {n_items} samples over {n_clients} clients")
    order = np.random.default_rng(seed).permutation(n_items)
    return [sorted(part.tolist()) for part in np.array_split(order, n_clients)]


def dirichlet_partition(
    labels: list[int],
    n_clients: int,
    alpha: float,
    seed: int,
    min_per_client: int = 1,
    max_tries: int = 10000,
) -> list[list[int]]:
    """Non-IID split of a pool whose samples carry a source label (FedPrLLM Sec. 4.3: 8 windows
    each of WikiText-2, C4 and PTB over 12 clients, alpha = 5).

    Standard FL practice (Hsu et al. 2019; NIID-Bench): for each source, in label order, draw
    proportions p ~ Dirichlet(alpha · 1_n_clients) and deal that source's samples, in a seeded
    random order, to the clients in those proportions (client i gets the samples between the cut
    points ``floor(n_source · cumsum(p))``). Every sample goes to exactly one client. Large alpha
    gives every client about the same mixture; small alpha gives each client few sources.

    A client with no sample has no calibration data and cannot compute a mask, so by default a
    draw that leaves any client with fewer than ``min_per_client`` samples is rejected and the
    whole draw repeated (NIID-Bench's rule), up to ``max_tries`` times; the accepted split is
    still deterministic in ``seed``. Rejection conditions on every client having data, which
    flattens the split a little for tiny pools (24 samples, 12 clients). ``min_per_client=0``
    accepts the first draw; empty clients are then returned as empty lists and the caller must
    drop them (and say so). Returns each client's sorted sample indices.
    """
    n_items = len(labels)
    if n_clients < 1:
        raise DataError(f"n_clients must be >= 1, got {n_clients}")
    if not alpha > 0:
        raise DataError(f"Dirichlet alpha must be > 0, got {alpha}")
    if min_per_client < 0 or n_clients * min_per_client > n_items:
        raise DataError(
            f"cannot give each of {n_clients} clients at least {min_per_client} of {n_items} samples"
        )
    rng = np.random.default_rng(seed)
    sources = sorted(set(int(x) for x in labels))
    members = {c: np.array([i for i, x in enumerate(labels) if int(x) == c], dtype=np.int64) for c in sources}
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for c in sources:
            idx = rng.permutation(members[c])
            proportions = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(int)
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].extend(piece.tolist())
        if min(len(p) for p in parts) >= min_per_client:
            return [sorted(p) for p in parts]
    raise DataError(
        f"no Dirichlet(alpha={alpha}) split of {n_items} samples over {n_clients} clients gave every "
        f"client at least {min_per_client} sample(s) in {max_tries} draws; raise alpha or the pool size, "
        "or pass min_per_client=0 and drop the empty clients"
    )


def calibration_split(dataset: str, data_dir: Path | None) -> str:
    """Which split :func:`calibration_windows` draws ``dataset`` from (for report tables):
    offline WikiText-2 has no train split, so its validation split stands in."""
    if dataset == "c4":
        return "train" if data_dir is None else "train (c4/train.jsonl, calibration document range)"
    if dataset == "wikitext2":
        return "train" if data_dir is None else "validation (offline mirror has no train split)"
    if dataset == "ptb":
        return "train"
    raise DataError(f"unknown calibration dataset {dataset!r}; known: {TEXT_DATASETS}")


def mixture_pool(
    tokenizer,
    data_dir: Path | None,
    per_dataset: int,
    seqlen: int,
    seed: int,
    datasets: tuple[str, ...] = MIXTURE_DATASETS,
    c4_docs: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """``per_dataset`` calibration windows from each of ``datasets`` (via
    :func:`calibration_windows`, same seed for each), stacked in that order: ``(input_ids
    (n, seqlen) int32, labels)`` with ``labels[i]`` the index in ``datasets`` of row i's source.
    Offline, WikiText-2 windows come from its validation split (:func:`calibration_split`);
    ``c4_docs`` restricts C4 to the calibration documents."""
    if per_dataset < 1:
        raise DataError(f"per_dataset must be >= 1, got {per_dataset}")
    chunks, labels = [], []
    for label, dataset in enumerate(datasets):
        ids = calibration_windows(tokenizer, dataset, data_dir, per_dataset, seqlen, seed,
                                  c4_docs if dataset == "c4" else None)
        chunks.append(ids)
        labels.extend([label] * ids.shape[0])
    return torch.cat(chunks).to(torch.int32), labels


# --------------------------------------------------------------------------- token files


def save_tokens(path: Path, input_ids: torch.Tensor, **metadata) -> None:
    meta = {k: json.dumps(v) for k, v in metadata.items()}
    write_safetensors(path, {"input_ids": input_ids.to(torch.int32)}, meta)


def load_tokens(path: Path) -> tuple[torch.Tensor, dict]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: token file not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            if "input_ids" not in handle.keys():
                raise DataError(f"{path}: expected a tensor 'input_ids'")
            ids = handle.get_tensor("input_ids")
            meta = {k: json.loads(v) for k, v in (handle.metadata() or {}).items()}
    except DataError:
        raise
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise DataError(f"{path}: not a readable token file ({err})") from None
    if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        raise DataError(f"{path}: input_ids must be an int tensor (n, seqlen), got {ids.dtype} {tuple(ids.shape)}")
    return ids.to(torch.long), meta
