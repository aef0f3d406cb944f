# Table specs: which result files make each report table (rows, cells, context), built by
# fedlib.catalog.Catalog (CATALOG, common.smk). Rules: report.smk (table1), zeroshot.smk,
# studies.smk (named targets); writer: `fedlib report`, plots: `fedlib plot`.

STUDY_SPECS = CATALOG.study_specs()
STUDY_PLOTS = CATALOG.study_plots()


def study_caption(name, kind="table"):
    """workflow/report/<name>.rst when there is one, else the generic caption of its kind."""
    own = Path(workflow.basedir) / "workflow" / "report" / f"{name}.rst"
    return f"../report/{name}.rst" if own.is_file() else f"../report/study_{kind}.rst"
