"""Rule reproduction_report: paper numbers beside reproduced ones (markdown, CSV, figure)."""

import pandas as pd

from pwopsd.io import atomic_path, read_json
from pwopsd.report.reproduction import (compare, comparison_figure, delta_verdicts, load_reference, render_delta_verdicts,
                                        render_markdown, render_sweep_agreement, reproduced_values)
from pwopsd.report.sweep import sign_agreement
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    branch = read_json(snakemake.input.branch) if "branch" in snakemake.input.keys() else None
    reproduced = reproduced_values(pd.read_csv(snakemake.input.summary), branch,
                                   diagnostic_model=snakemake.params.report["diagnostic_model"])
    comparison = compare(load_reference(snakemake.input.reference), reproduced)
    note = ("**Tiny mode**: the models and benchmarks are the toy ones built by the workflow; the numbers below are "
            "the reproduced side only and are not comparable to the paper's." if snakemake.params.report["tiny"] else
            "Paper configuration: published numbers from `workflow/reference/paper_results.csv` (source table in "
            "the first column) beside this run's.")
    r = snakemake.params.report
    others = [g for g in r["graders"] if g != r["verdicts"]]
    note += (f" Verdicts of the `{r['verdicts']}` grader (`grading.verdicts`)"
             + (f"; the {', '.join(f'`{g}`' for g in others)} grader's values are in the last column." if others else ".")
             + " See docs/decisions.md, \"Grading and metrics\".")
    significance = [pd.read_csv(p) for p in snakemake.input.significance]
    verdicts = delta_verdicts(load_reference(snakemake.input.reference),
                              pd.concat(significance, ignore_index=True) if significance else pd.DataFrame(
                                  columns=["model", "method", "baseline", "benchmark", "metric"]))
    text = render_markdown(comparison, reproduced, title_note=note) + "\n" + render_delta_verdicts(verdicts)
    if snakemake.input.get("sweep"):  # evaluation.sweep_steps
        sweep = pd.concat([pd.read_csv(p) for p in snakemake.input.sweep], ignore_index=True)
        text += "\n" + render_sweep_agreement(sign_agreement(verdicts, sweep), sorted(sweep["step"].unique()),
                                               int(sweep.loc[sweep["eval_step"], "step"].iloc[0]))
    with atomic_path(snakemake.output.markdown) as tmp:
        tmp.write_text(text)
    with atomic_path(snakemake.output.csv) as tmp:
        comparison.to_csv(tmp, index=False, float_format="%.6f")
    comparison_figure(comparison, reproduced, snakemake.output.pdf, snakemake.output.figure_csv)
    write_job_provenance(snakemake, snakemake.output.provenance)
    log.info("%d reference numbers, %d reproduced", len(comparison), int(comparison["reproduced"].notna().sum()))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("reproduction_report"))  # noqa: F821
