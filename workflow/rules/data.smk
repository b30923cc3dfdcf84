rule prepare_data:
    output:
        "results/{dataset}/data.h5",
    log:
        "logs/{dataset}/prepare_data.log",
    benchmark:
        "logs/{dataset}/prepare_data.bench.tsv"
    threads: rule_threads("prepare_data")
    resources:
        cpus_per_task=rule_cpus("prepare_data"),
        mem_mb=requested("prepare_data", "mem_mb"),
        runtime=requested("prepare_data", "runtime"),
    params:
        settings=get_dataset_settings,
        source_checksum=get_source_checksum,
    script:
        "../scripts/prepare_data.py"


# The DP warm-up without public data: noisy means of disjoint groups of private records (one Gaussian release,
# src/dpsad/privacy/mechanism/group_means.py), for teachers with split: central; their ledgers carry its cost.
rule central_images:
    input:
        data=PREPARED_DATA,
    output:
        images="results/{dataset}/central.h5",
        ledger="results/{dataset}/central.ledger.json",
    log:
        "logs/{dataset}/central_images.log",
    benchmark:
        "logs/{dataset}/central_images.bench.tsv"
    threads: rule_threads("prepare_data")
    resources:
        cpus_per_task=rule_cpus("prepare_data"),
        mem_mb=requested("prepare_data", "mem_mb"),
        runtime=requested("prepare_data", "runtime"),
    params:
        settings=config["central"],
        delta=get_dataset_delta_of_budget,
        dp_code=CENTRAL_CODE,
    script:
        "../scripts/central_images.py"
