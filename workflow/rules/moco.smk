# MoCo features and k-means pseudo-labels; part of the DAG only when a run or teacher uses labels: kmeans.
rule train_moco:
    input:
        data="results/{dataset}/data.h5",
    output:
        encoder="results/{dataset}/moco/encoder.pt",
        ledger="results/{dataset}/moco/encoder.ledger.json",
        losses="results/{dataset}/moco/loss.csv",
    log:
        "logs/{dataset}/train_moco.log",
    benchmark:
        "logs/{dataset}/train_moco.bench.tsv"
    threads: rule_threads("train_moco")
    resources:
        cpus_per_task=rule_cpus("train_moco"),
        gpu=requested_gpus("train_moco"),
        mem_mb=requested("train_moco", "mem_mb"),
        runtime=requested("train_moco", "runtime"),
    params:
        settings=config["moco"],
    script:
        "../scripts/train_moco.py"


rule extract_features:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA, encoder="results/{dataset}/moco/encoder.pt"
            )
        ),
    output:
        features="results/{dataset}/moco/features.h5",
        ledger="results/{dataset}/moco/features.ledger.json",
    log:
        "logs/{dataset}/extract_features.log",
    benchmark:
        "logs/{dataset}/extract_features.bench.tsv"
    threads: rule_threads("extract_features")
    resources:
        cpus_per_task=rule_cpus("extract_features"),
        gpu=requested_gpus("extract_features"),
        mem_mb=requested("extract_features", "mem_mb"),
        runtime=requested("extract_features", "runtime"),
    params:
        which=config["moco"]["features"],
        # the private split's features from each record alone; a workspace whose features were batched reruns
        private_records="each alone",
    script:
        "../scripts/extract_features.py"


rule kmeans_labels:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA,
                features=get_label_features,
                teacher=get_label_teacher,
            )
        ),
    output:
        labels="results/{dataset}/labels.h5",
        ledger="results/{dataset}/labels.ledger.json",
    log:
        "logs/{dataset}/kmeans_labels.log",
    benchmark:
        "logs/{dataset}/kmeans_labels.bench.tsv"
    threads: rule_threads("kmeans_labels")
    resources:
        cpus_per_task=rule_cpus("kmeans_labels"),
        gpu=requested_gpus("kmeans_labels"),
        mem_mb=requested("kmeans_labels", "mem_mb"),
        runtime=requested("kmeans_labels", "runtime"),
    params:
        settings=get_label_kmeans_settings,
        # each private record's label from its own features alone (not a matrix product over the split)
        private_records="each alone",
    script:
        "../scripts/kmeans_labels.py"


# Curator-only scores of every feature kind against the private labels: its own job, so a key that only adds a
# row here (kmeans.teacher with other features) reruns this report and not the labels or any DP stage after them.
# It reads private labels without noise: its ledger says so, and the curator's spending record counts it.
rule cluster_report:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA,
                features="results/{dataset}/moco/features.h5",
                teacher=get_feature_teacher,
            )
        ),
    output:
        report=report(
            "results/{dataset}/cluster_report.json",
            category="Labels",
            caption="../report/clusters.rst",
            labels={"dataset": "{dataset}", "figure": "cluster report"},
        ),
        markdown="results/{dataset}/cluster_report.md",
        ledger="results/{dataset}/cluster_report.ledger.json",
    log:
        "logs/{dataset}/cluster_report.log",
    benchmark:
        "logs/{dataset}/cluster_report.bench.tsv"
    threads: rule_threads("kmeans_labels")
    resources:
        cpus_per_task=rule_cpus("kmeans_labels"),
        gpu=requested_gpus("kmeans_labels"),
        mem_mb=requested("kmeans_labels", "mem_mb"),
        runtime=requested("kmeans_labels", "runtime"),
    params:
        settings=config["kmeans"],
    script:
        "../scripts/cluster_report.py"
