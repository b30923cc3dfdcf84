rule train_evaluator:
    input:
        data="results/{dataset}/data.h5",
    output:
        "results/{dataset}/evaluator.pt",
    params:
        settings=config["evaluate"],
    log:
        "logs/{dataset}/train_evaluator.log",
    benchmark:
        "logs/{dataset}/train_evaluator.bench.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/train_evaluator.py"


rule evaluate:
    input:
        data="results/{dataset}/data.h5",
        evaluator="results/{dataset}/evaluator.pt",
        synthetic="results/{dataset}/{run}/synthetic.h5",
        privacy="results/{dataset}/{run}/privacy.json",
        labels=get_pseudo_labels,
    output:
        "results/{dataset}/{run}/metrics.json",
    params:
        settings=config["evaluate"],
    log:
        "logs/{dataset}/evaluate_{run}.log",
    benchmark:
        "logs/{dataset}/evaluate_{run}.bench.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/evaluate.py"


rule evaluate_real:
    input:
        data="results/{dataset}/data.h5",
        evaluator="results/{dataset}/evaluator.pt",
    output:
        "results/{dataset}/real/metrics.json",
    params:
        settings=config["evaluate"],
    log:
        "logs/{dataset}/evaluate_real.log",
    benchmark:
        "logs/{dataset}/evaluate_real.bench.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/evaluate_real.py"


rule compare:
    input:
        get_all_metrics(),
    output:
        csv=report("results/comparison.csv", category="Comparison", caption="../report/comparison.rst"),
        md="results/comparison.md",
    log:
        "logs/compare.log",
    benchmark:
        "logs/compare.bench.tsv"
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/compare.py"
