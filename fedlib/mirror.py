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
