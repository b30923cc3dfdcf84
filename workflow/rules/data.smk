rule prepare_data:
    output:
        "results/{dataset}/data.h5",
    log:
        "logs/{dataset}/prepare_data.log",
    benchmark:
        "logs/{dataset}/prepare_data.bench.tsv"
    conda:
        "../../envs/dpsad.yaml"
    threads: rule_threads("prepare_data")
    resources:
        cpus_per_task=rule_threads("prepare_data"),
        mem_mb=requested("prepare_data", "mem_mb"),
        runtime=requested("prepare_data", "runtime"),
    params:
        settings=get_dataset_settings,
        source_checksum=get_source_checksum,
    script:
        "../scripts/prepare_data.py"
