# Privacy audit of the shared masks (FedPrLLM Sec. 4.5 / App. C, made into real measurements):
# entropy, similarity, sensitivity, membership inference, inversion, and the randomized-response
# defence with its perplexity cost. Two size sets: "run" (config `privacy:`, reduced, part of
# `make run`) and "full" (`privacy.full:` overrides per analysis; target privacy_full).
# Sizes, paths and the report spec: fedlib.catalog.privacy (PRIVACY); the rules in privacy.smk.

PRIVACY = PrivacyCatalog(CATALOG)
PRIV_BASE = PRIVACY.base


def priv_outputs(size, for_report=False):
    """The audit's tables and plots; ``for_report`` flags the HTML pages and plots for the HTML report."""
    tables, shown = PRIVACY.outputs(size)
    if for_report:
        caption = "../report/privacy.rst" if size == "run" else "../report/privacy_full.rst"
        shown = [report(path, caption=caption, category="Privacy") for path in shown]
    return tables + shown


#: the reduced audit's tables and plots (rule all)
PRIVACY_RUN_REPORTS = priv_outputs("run")
