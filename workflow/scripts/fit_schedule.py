"""Rule fit_schedule (beyond the paper): the PW-OPSD schedule fitted to a model's diagnostic."""

from pwopsd.diagnostic.scores import fitted_schedule
from pwopsd.io import read_parquet, write_json
from pwopsd.runtime import provenance, setup_logging
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    model = snakemake.wildcards.model
    fit = fitted_schedule(read_parquet(snakemake.input.scored), snakemake.params.settings, model=model)
    fit["provenance"] = provenance(phase="fit_schedule", model=model)
    write_json(fit, snakemake.output.schedule)
    log.info("%s: w_min %.3f, tau %.3f, s %.3f (v_max %.3f); %s", model, *fit["params"].values(), fit["v_max"],
             {k: [None if v is None else round(v, 3) for v in ci] for k, ci in fit["ci"].items()})


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("fit_schedule"))  # noqa: F821
