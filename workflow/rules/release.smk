# The release of each run: the only files meant to leave results/ (see src/dpsad/release.py).
rule release:
    input:
        synthetic="results/{dataset}/{run}/synthetic.h5",
        privacy="results/{dataset}/{run}/privacy.json",
        generator=get_generator,
    output:
        directory("release/{dataset}/{run}"),
    params:
        include_generator=config["release"]["generator"],
    log:
        "logs/{dataset}/release_{run}.log",
    benchmark:
        "logs/{dataset}/release_{run}.bench.tsv"
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/release.py"
