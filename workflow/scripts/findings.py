import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

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
