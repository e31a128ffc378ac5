import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.responses.conversations import import_conversations

counts = import_conversations(
    snakemake.params.source,
    snakemake.output.conversations,
    num_conversations=snakemake.params.num_conversations,
    seed=snakemake.params.seed,
)
print(counts)
