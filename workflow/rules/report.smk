# Reproduction report: the paper's published numbers (Tables 1-5, workflow/reference/) beside the
# reproduced ones, with differences and agreement within the across-seed spread.


rule reproduction_report:
    input:
        unpack(reproduction_inputs),
    output:
        markdown=report("results/report/reproduction.md", caption="../report/reproduction.rst", category="Reproduction"),
        csv="results/report/reproduction.csv",
        pdf=report("results/report/reproduction.pdf", caption="../report/reproduction.rst", category="Reproduction"),
        figure_csv="results/report/reproduction_figure.csv",
        provenance="results/report/reproduction.provenance.json",
    params:
        report=config_param(settings.report_settings),
    log:
        "logs/report/reproduction.log",
    benchmark:
        "logs/benchmarks/report/reproduction.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/reproduction_report.py"
