"""Rule sweep: the checkpoint sweep of one table (beyond the paper): each method at every swept
step, its rank, its difference to the baseline (interval, p, Holm over the sweep), as LaTeX + CSV,
and the figure of the mean column against the step (+ its data as CSV)."""

from pwopsd.config import plain_label
from pwopsd.io import atomic_path, read_json
from pwopsd.report.figures import sweep_figure
from pwopsd.report.sweep import sweep_frame, sweep_values
from pwopsd.report.tables import sweep_table
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    spec = dict(snakemake.params.spec)
    summaries = [read_json(p) for p in snakemake.input.metrics]
    comparisons = [tuple(c) for c in spec["comparisons"]]
    runs = {m: list(r) for m, r in spec["runs"].items()}
    frame = sweep_frame(summaries, comparisons, spec["benchmarks"], spec["metrics"], runs, spec["steps"], spec["eval_step"],
                        level=spec["level"])
    metric = "avg" if "avg" in spec["metrics"] else spec["metrics"][0]
    model = comparisons[0][0]
    base = sweep_values(summaries, [(model, "base")], spec["benchmarks"], [metric], {"base": ["base"]}, [spec["eval_step"]],
                        spec["eval_step"], level=spec["level"])
    base_value = float(base.loc[base["benchmark"] == ("mean" if len(spec["benchmarks"]) > 1 else spec["benchmarks"][0]),
                                "value"].iloc[0])
    benchmark = "mean" if len(spec["benchmarks"]) > 1 else spec["benchmarks"][0]
    tex = sweep_table(frame, method_labels=spec["method_labels"], level=spec["level"], n=spec["n"], metric=metric,
                      benchmark=benchmark, label=f"tab:sweep-{snakemake.wildcards.table.replace('_', '-')}")
    with atomic_path(snakemake.output.tex) as tmp:
        tmp.write_text(tex)
    with atomic_path(snakemake.output.csv) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6f")
    sweep_figure(frame, labels={k: plain_label(v) for k, v in spec["method_labels"].items()}, metric=metric,
                 benchmark=benchmark, base_value=base_value, pdf_path=snakemake.output.pdf, csv_path=snakemake.output.figure_csv)
    held = frame[(frame["metric"] == metric) & (frame["benchmark"] == benchmark)].drop_duplicates("method")
    log.info("sweep of %s over steps %s: the rank at step %d holds at every step for %d of %d methods",
             snakemake.wildcards.table, spec["steps"], spec["eval_step"], int(held["rank_holds"].sum()), len(held))
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("sweep"))  # noqa: F821
