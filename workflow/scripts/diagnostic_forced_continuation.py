"""Rule forced_continuation (diagnostic Phase E): student-context rollouts after each forced child."""

import time

from pwopsd.accelerator import require_job_cuda
from pwopsd.diagnostic.phases import forced_continuation_plan
from pwopsd.generation.sampling import generate_resumable, generation_identity, make_backend
from pwopsd.io import clear_partial, one_writer, partial_dir, read_parquet, write_parquet
from pwopsd.models import load_tokenizer, read_manifest
from pwopsd.runtime import provenance, set_threads, setup_logging
from pwopsd.settings import execution_settings
from pwopsd.standalone import standalone_snakemake
from pwopsd.notice import Notice, exit_on_notice


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    require_job_cuda(snakemake)  # asked for GPUs and found none: stop now, not after a CPU fallback
    s, out = snakemake.params.settings, snakemake.output.continuations
    manifest = read_manifest(snakemake.input.model)
    requests, keys = forced_continuation_plan(read_parquet(snakemake.input.spines),
                                              read_parquet(snakemake.input.candidates), s)
    options = execution_settings(snakemake.config, snakemake.wildcards.model)["backend_options"]
    # Kept shards are the work of these weights (by content), dtype, backend, engine, code and requests.
    key = {"identity": generation_identity(manifest, dtype=s["dtype"], backend_name=snakemake.params.backend,
                                           backend_options=options, code="pwopsd.diagnostic.phases",
                                           max_model_len=s["forced_continuation"]["max_model_len"]),
           "requests": requests, "keys": keys}
    tokenizer = load_tokenizer(manifest)
    t0 = time.time()
    # On a notice signal the shard in progress is saved and the job exits 75 (resumable) before the next.
    with exit_on_notice(console=True), one_writer(out, f"forced_continuation {snakemake.wildcards.model}"), \
            Notice() as notice, \
            make_backend(snakemake.params.backend, manifest, dtype=s["dtype"],
                         max_model_len=s["forced_continuation"]["max_model_len"], options=options,
                         tokenizer=tokenizer) as backend:
        table = generate_resumable(backend, requests, keys, partial=partial_dir(out, key), notice=notice)
    # the forced child's text: the labels read a continuation's answer from the child on
    table["child_text"] = [tokenizer.decode([int(c)]) for c in table.get("child_id", [])]
    write_parquet(table, out, metadata=provenance(manifest, phase="E", settings=s, backend=backend.versions(),
                                                  seconds=round(time.time() - t0, 3)))
    clear_partial(out)
    log.info("forced continuations: %d rollouts for %d (candidate, child) pairs", len(table), len(requests))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("forced_continuation"))  # noqa: F821
