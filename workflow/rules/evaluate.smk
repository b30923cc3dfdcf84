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
        settings=EVALUATE_SETTINGS,
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
        settings=EVALUATE_SETTINGS,
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
        settings=EVALUATE_SETTINGS,
    script:
        "../scripts/evaluate_real.py"


rule inception_figures:
    input:
        data="results/{dataset}/data.h5",
        synthetic=get_synthetic_of_runs,
    output:
        "results/{dataset}/inception.json",
    log:
        "logs/{dataset}/inception_figures.log",
    benchmark:
        "logs/{dataset}/inception_figures.bench.tsv"
    threads: rule_threads("inception_figures")
    resources:
        cpus_per_task=rule_cpus("inception_figures"),
        mem_mb=requested("inception_figures", "mem_mb"),
        runtime=requested("inception_figures", "runtime"),
        gpu=requested_gpus("inception_figures"),
    params:
        runs=[run["name"] for run in config["runs"]],
        settings=INCEPTION_SETTINGS,
    script:
        "../scripts/inception_figures.py"


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
        metrics=get_all_metrics(),
        inception=get_inception_figures(),
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
