# The release of each run: the only files meant to leave results/ (see src/dpsad/release.py).
# `snakemake release` builds the release folders and what they need, nothing else (no evaluation).
rule release:
    input:
        get_release_outputs(),


# Write-protected once built: Snakemake will not overwrite a release (a rerun of a DP stage would read the
# private records again and spend budget again); remove the folder by hand to rebuild it on purpose.
rule release_run:
    input:
        synthetic="results/{dataset}/{run}/synthetic.h5",
        privacy="results/{dataset}/{run}/privacy.json",
        generator=get_generator,
    output:
        protected(directory("release/{dataset}/{run}")),
    log:
        "logs/{dataset}/release_{run}.log",
    benchmark:
        "logs/{dataset}/release_{run}.bench.tsv"
    conda:
        "../../envs/dpsad.yaml"
    resources:
        mem_mb=attempt_scaled(4000),
        runtime=attempt_scaled(30),
    params:
        include_generator=config["release"]["generator"],
    script:
        "../scripts/release.py"
