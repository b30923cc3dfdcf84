rule prepare_data:
    output:
        "results/{dataset}/data.h5",
    params:
        settings=get_dataset_settings,
    log:
        "logs/{dataset}/prepare_data.log",
    benchmark:
        "logs/{dataset}/prepare_data.bench.tsv"
    resources:
        mem_mb=4000,
        runtime=60,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/prepare_data.py"
