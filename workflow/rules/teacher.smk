rule train_teacher:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA,
                labels=get_teacher_pseudo_labels,
                init=get_teacher_init,
                central=get_teacher_central,
                population=get_teacher_population,
            )
        ),
    output:
        model="results/{dataset}/teacher/{teacher}.pt",
        ledger="results/{dataset}/teacher/{teacher}.ledger.json",
        losses="results/{dataset}/teacher/{teacher}.loss.csv",
        plot=report(
            "results/{dataset}/teacher/{teacher}.loss.png",
            category="Training",
            caption="../report/loss.rst",
            labels={
                "dataset": "{dataset}",
                "run": "teacher {teacher}",
                "figure": "loss",
            },
        ),
    log:
        "logs/{dataset}/train_teacher_{teacher}.log",
    benchmark:
        "logs/{dataset}/train_teacher_{teacher}.bench.tsv"
    threads: rule_threads("train_teacher")
    resources:
        cpus_per_task=rule_cpus("train_teacher"),
        gpu=requested_gpus("train_teacher"),
        mem_mb=requested("train_teacher", "mem_mb"),
        runtime=requested("train_teacher", "runtime"),
    params:
        settings=lambda wc: teacher_settings(config, wc.teacher).result_view(),
        diffusion=config["diffusion"],
        labels=get_teacher_labels,
        dp_code=get_teacher_dp_code,
    script:
        "../scripts/train_teacher.py"
