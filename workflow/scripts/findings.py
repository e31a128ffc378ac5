from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.report.findings import checkout_commit, write_findings

found = write_findings(
    snakemake.input.claims,
    snakemake.params.results,
    snakemake.output.findings,
    config_name=snakemake.resources.config_name,
    commit=checkout_commit(snakemake.scriptdir),
    experiments=snakemake.params.experiments,
)
for finding in found:
    print(finding.claim["id"], finding.cell, finding.verdict, finding.note)
