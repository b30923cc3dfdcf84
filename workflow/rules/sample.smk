rule sample:
    input:
        generator=get_generator,
        privacy="results/{dataset}/{run}/privacy.json",
    output:
        synthetic="results/{dataset}/{run}/synthetic.h5",
        grid=report(
            "results/{dataset}/{run}/grid.png",
            category="Samples",
            caption="../report/grid.rst",
        ),
    params:
        settings=get_sample_settings,
        method=lambda wc: get_run(wc)["method"],
        config_sha256=get_run_config_digest,
        device=config["device"],
    log:
        "logs/{dataset}/sample_{run}.log",
    benchmark:
        "logs/{dataset}/sample_{run}.bench.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=120,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/sample.py"
