# Named study targets beyond Table 1; their specs: common.smk (fedlib.catalog.Catalog).

for _name, _spec in STUDY_SPECS.items():

    rule:
        name:
            f"study_{_name}"
        input:
            table_inputs(_spec()),
        output:
            md=f"{REPORTS}/{_name}.md",
            csv=f"{REPORTS}/{_name}.csv",
            html=report(f"{REPORTS}/{_name}.html", caption=study_caption(_name), category=CATALOG.study_category(_name)),
        log:
            f"{LOGS}/report/{_name}.log",
        benchmark:
            f"{BENCH}/report/{_name}.tsv"
        localrule: True
        conda:
            "../../envs/fedlib.yaml"
        params:
            spec=json.dumps(_spec()),
        shell:
            f"{FEDLIB} report --spec {{params.spec:q}} --out-md {{output.md}} --out-csv {{output.csv}} "
            "--out-html {output.html} > {log} 2>&1"


for _name, _spec in STUDY_PLOTS.items():

    rule:
        name:
            f"plot_{_name}"
        input:
            plot_inputs(_spec()),
        output:
            report(f"{REPORTS}/{_name}.png", caption=study_caption(f"{_name}_plot", "plot"), category="Sweeps"),
        log:
            f"{LOGS}/report/{_name}_plot.log",
        benchmark:
            f"{BENCH}/report/{_name}_plot.tsv"
        localrule: True
        conda:
            "../../envs/fedlib.yaml"
        params:
            spec=json.dumps(_spec()),
        shell:
            f"{FEDLIB} plot --spec {{params.spec:q}} --out {{output}} > {{log}} 2>&1"


for _name in STUDY_SPECS:

    rule:
        name:
            _name
        input:
            f"{REPORTS}/{_name}.md",
            [f"{REPORTS}/{_name}.png"] if _name in STUDY_PLOTS else [],


rule tables_all:
    input:
        [f"{REPORTS}/{name}.md" for name in STUDY_SPECS],
