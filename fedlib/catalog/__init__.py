"""The workflow's catalogue: variant labels and setting components (variants), the table specs
built from a config (tables.Catalog) and the privacy audit's (privacy.PrivacyCatalog).
Pure Python, no Snakemake: workflow/rules/*.smk call it, tests/test_catalog.py tests it."""

from fedlib.catalog.privacy import PrivacyCatalog, eps_name
from fedlib.catalog.tables import Catalog, config_hash, plot_inputs, table_inputs
from fedlib.catalog.variants import (
    CALIB_PATTERN,
    GROUP_PATTERN,
    LABEL_PATTERN,
    PRUNE_PATTERN,
    SETTING_LABEL_PATTERN,
    SPLIT_PATTERN,
    Calib,
    Prune,
    Split,
    Variant,
    group_arg,
    group_path,
)

__all__ = [
    "CALIB_PATTERN", "GROUP_PATTERN", "LABEL_PATTERN", "PRUNE_PATTERN", "SETTING_LABEL_PATTERN", "SPLIT_PATTERN",
    "Calib", "Catalog", "PrivacyCatalog", "Prune", "Split", "Variant", "config_hash", "eps_name", "group_arg", "group_path",
    "plot_inputs", "table_inputs",
]
