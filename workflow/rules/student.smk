rule distill_student:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA, teacher=get_run_teacher, labels=get_pseudo_labels
            )
        ),
    output:
        model="results/{dataset}/{run}/student.pt",
        ledger="results/{dataset}/{run}/student.ledger.json",
        losses="results/{dataset}/{run}/student_loss.csv",
        plot=report(
            "results/{dataset}/{run}/student_loss.png",
            category="Training",
            caption="../report/loss.rst",
            labels={"dataset": "{dataset}", "run": "{run}", "figure": "student loss"},
        ),
    log:
        "logs/{dataset}/distill_student_{run}.log",
    benchmark:
        "logs/{dataset}/distill_student_{run}.bench.tsv"
    threads: rule_threads("distill_student")
    resources:
        cpus_per_task=rule_cpus("distill_student"),
        gpu=requested_gpus("distill_student"),
        mem_mb=requested("distill_student", "mem_mb"),
        runtime=requested("distill_student", "runtime"),
    params:
        settings=get_student_settings,
        labels=get_run_labels,
        dp_code=DP_CODE,
    script:
        "../scripts/distill_student.py"
