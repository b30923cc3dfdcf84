rule prepare_data:
    output:
        "results/{dataset}/data.h5",
    log:
        "logs/{dataset}/prepare_data.log",
    benchmark:
        "logs/{dataset}/prepare_data.bench.tsv"
    conda:
        "../../envs/dpsad.yaml"
    resources:
        mem_mb=attempt_scaled(4000),
        runtime=attempt_scaled(60),
    params:
        settings=get_dataset_settings,
    script:
        "../scripts/prepare_data.py"
