rule sample:
    input:
        generator=get_generator,
        privacy="results/{dataset}/{run}/privacy.json",
        ledger=get_generator_ledger,
    output:
        synthetic="results/{dataset}/{run}/synthetic.h5",
        grid=report(
            "results/{dataset}/{run}/grid.png",
            category="Samples",
            caption="../report/grid.rst",
            labels={"dataset": "{dataset}", "run": "{run}", "figure": "samples"},
        ),
    log:
        "logs/{dataset}/sample_{run}.log",
    benchmark:
        "logs/{dataset}/sample_{run}.bench.tsv"
    threads: rule_threads("sample")
    resources:
        cpus_per_task=rule_cpus("sample"),
        gpu=requested_gpus("sample"),
        mem_mb=requested("sample", "mem_mb"),
        runtime=requested("sample", "runtime"),
    params:
        settings=get_sample_settings,
        method=lambda wc: get_run(wc)["method"],
        config_sha256=get_run_config_digest,
    script:
        "../scripts/sample.py"
