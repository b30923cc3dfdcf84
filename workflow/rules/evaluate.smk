rule train_evaluator:
    input:
        data="results/{dataset}/data.h5",
    output:
        "results/{dataset}/evaluator.pt",
    log:
        "logs/{dataset}/train_evaluator.log",
    benchmark:
        "logs/{dataset}/train_evaluator.bench.tsv"
    threads: rule_threads("train_evaluator")
    resources:
        cpus_per_task=rule_cpus("train_evaluator"),
        mem_mb=requested("train_evaluator", "mem_mb"),
        runtime=requested("train_evaluator", "runtime"),
    params:
        settings=config["evaluate"],
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
    log:
        "logs/{dataset}/evaluate_{run}.log",
    benchmark:
        "logs/{dataset}/evaluate_{run}.bench.tsv"
    threads: rule_threads("evaluate")
    resources:
        cpus_per_task=rule_cpus("evaluate"),
        mem_mb=requested("evaluate", "mem_mb"),
        runtime=requested("evaluate", "runtime"),
    params:
        settings=config["evaluate"],
        labels=get_run_labels,
    script:
        "../scripts/evaluate.py"


rule evaluate_real:
    input:
        data="results/{dataset}/data.h5",
        evaluator="results/{dataset}/evaluator.pt",
    output:
        "results/{dataset}/real/metrics.json",
    log:
        "logs/{dataset}/evaluate_real.log",
    benchmark:
        "logs/{dataset}/evaluate_real.bench.tsv"
    threads: rule_threads("evaluate_real")
    resources:
        cpus_per_task=rule_cpus("evaluate_real"),
        mem_mb=requested("evaluate_real", "mem_mb"),
        runtime=requested("evaluate_real", "runtime"),
    params:
        settings=config["evaluate"],
    script:
        "../scripts/evaluate_real.py"


rule sweep:
    input:
        expand("results/{dataset}/sweep.png", dataset=config["datasets"]),


rule sweep_plot:
    input:
        get_sweep_metrics,
    output:
        csv="results/{dataset}/sweep.csv",
        plot=report(
            "results/{dataset}/sweep.png",
            category="Comparison",
            caption="../report/sweep.rst",
            labels={"dataset": "{dataset}", "figure": "utility against epsilon"},
        ),
    log:
        "logs/{dataset}/sweep_plot.log",
    localrule: True
    script:
        "../scripts/sweep_plot.py"


rule compare:
    input:
        get_all_metrics(),
    output:
        csv=report(
            "results/comparison.csv",
            category="Comparison",
            caption="../report/comparison.rst",
            labels={"figure": "comparison table"},
        ),
        md="results/comparison.md",
    log:
        "logs/compare.log",
    benchmark:
        "logs/compare.bench.tsv"
    localrule: True
    script:
        "../scripts/compare.py"
