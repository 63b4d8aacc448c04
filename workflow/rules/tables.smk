# Tables 2-5 and Figure 2. Each table reads the per-seed metrics of exactly its own runs, so a
# table target pulls in only the runs it shows.


rule table:
    input:
        metrics=table_metrics,
    output:
        tex=report("results/tables/{table}.tex", caption="../report/table.rst", category="Tables", labels={"table": "{table}", "format": "LaTeX"}),
        csv=report("results/tables/{table}.csv", caption="../report/table.rst", category="Tables", labels={"table": "{table}", "format": "CSV"}),
        provenance="results/tables/{table}.provenance.json",
    params:
        spec=config_param(settings.table_spec),
        benchmarks=config_param(settings.benchmarks),
    log:
        "logs/tables/{table}.log",
    benchmark:
        "logs/benchmarks/tables/{table}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/make_table.py"


# Beyond the paper: is a method's gain larger than the noise? Each method of a table against the
# baseline (significance.baseline), paired by problem, from the same per-seed metrics as the table.
rule significance:
    input:
        metrics=significance_metrics,
    output:
        tex=report("results/tables/significance_{table}.tex", caption="../report/significance.rst", category="Tables", labels={"table": "significance {table}", "format": "LaTeX"}),
        csv="results/tables/significance_{table}.csv",
        pdf=report("results/figures/deltas_{table}.pdf", caption="../report/significance.rst", category="Figures", labels={"figure": "deltas {table}"}),
        figure_csv="results/figures/deltas_{table}.csv",
        provenance="results/tables/significance_{table}.provenance.json",
    wildcard_constraints:
        table=_alternatives(SIGNIFICANCE_OUTPUTS),
    params:
        spec=config_param(settings.significance_spec),
    log:
        "logs/tables/significance_{table}.log",
    benchmark:
        "logs/benchmarks/tables/significance_{table}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/significance.py"


rule sweep:
    # Beyond the paper (evaluation.sweep_steps): each method of a table at every swept step.
    input:
        metrics=sweep_metrics,
    output:
        tex=report("results/tables/sweep_{table}.tex", caption="../report/sweep.rst", category="Tables", labels={"table": "sweep {table}", "format": "LaTeX"}),
        csv="results/tables/sweep_{table}.csv",
        pdf=report("results/figures/sweep_{table}.pdf", caption="../report/sweep.rst", category="Figures", labels={"figure": "sweep {table}"}),
        figure_csv="results/figures/sweep_{table}.csv",
        provenance="results/tables/sweep_{table}.provenance.json",
    wildcard_constraints:
        table=_alternatives(SWEEP_OUTPUTS),
    params:
        spec=config_param(settings.sweep_spec),
    log:
        "logs/tables/sweep_{table}.log",
    benchmark:
        "logs/benchmarks/tables/sweep_{table}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/sweep.py"


rule schedules_figure:
    input:
        unpack(schedules_figure_inputs),
    output:
        pdf=report("results/figures/pwopsd_schedules.pdf", caption="../report/schedules.rst", category="Figures", labels={"figure": "Figure 2 schedules"}),
        csv="results/figures/pwopsd_schedules.csv",
        provenance="results/figures/pwopsd_schedules.provenance.json",
    params:
        schedules=config_param(settings.schedules),
    log:
        "logs/figures/pwopsd_schedules.log",
    benchmark:
        "logs/benchmarks/figures/pwopsd_schedules.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/schedules_figure.py"
