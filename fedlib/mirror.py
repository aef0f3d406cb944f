"""The offline data mirror's layout (``data_dir``, laid out like ``../shared/data``): which file
holds a dataset's split, and which split calibration and evaluation read offline.

:mod:`fedlib.data` reads through it, and :mod:`fedlib.config_check` checks before any job that
the files a configuration needs are there. No torch here: the check runs on every dry run.
(Zero-shot task files: :func:`fedlib.evaluate.zeroshot.task_file`.)
"""

from __future__ import annotations

from pathlib import Path

#: the calibration data mixed for the non-IID experiments, in label order
MIXTURE_DATASETS = ("wikitext2", "c4", "ptb")
#: the split calibration windows come from offline (the mirror has no WikiText-2 train split)
CALIBRATION_SPLIT = {"c4": "train", "wikitext2": "validation", "ptb": "train"}
#: the split perplexity is evaluated on offline (the mirror has no C4 validation split: held-out
#: documents of train stand in for it)
EVALUATION_SPLIT = {"wikitext2": "test", "ptb": "test", "c4": "train"}


def mirror_path(data_dir: str | Path, dataset: str, split: str) -> Path:
    """``{data_dir}/{dataset}/{split}.jsonl`` for C4 (one JSON document per line), ``.txt`` otherwise."""
    return Path(data_dir) / dataset / f"{split}.{'jsonl' if dataset == 'c4' else 'txt'}"


#: what `fedlib data` rebuilds the mirror from (fedlib.datafetch): each file's sources and sha256
DATA_SOURCES = Path(__file__).resolve().parent / "data_sources.json"
#: where `make data` / `fedlib data` put the files (relative to the working directory)
FETCHED_DATA_DIR = "resources/data"
#: the offline mirror beside the checkout, where a machine provides one
SHARED_DATA_DIR = "../shared/data"
#: the data_dir value that picks the first of SHARED_DATA_DIR, FETCHED_DATA_DIR that exists
AUTO = "auto"


def resolve_data_dir(value: str | None, workdir: str | Path) -> str | None:
    """data_dir as the jobs read it: None (the Hugging Face hub) and explicit paths unchanged;
    ``auto``: ../shared/data when present, else resources/data (relative to ``workdir``).
    Raises FileNotFoundError naming both ways to get data when ``auto`` finds neither."""
    if value != AUTO:
        return value
    for candidate in (SHARED_DATA_DIR, FETCHED_DATA_DIR):
        if (Path(workdir) / candidate).is_dir():
            return candidate
    raise FileNotFoundError(
        f"data_dir = {AUTO}: no data mirror at {SHARED_DATA_DIR} or {FETCHED_DATA_DIR}: run `make data` (or "
        f"`fedlib data`) to fetch it into {FETCHED_DATA_DIR} (27 MB of data, about 100 MB downloaded), or set "
        f"data_dir to a folder laid out like it, or data_dir: null with HF_HUB_OFFLINE=0 to read the Hugging "
        f"Face hub")
