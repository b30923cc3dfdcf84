rule distill_student:
    input:
        data="results/{dataset}/data.h5",
        teacher=get_run_teacher,
        teacher_ledgers=get_teacher_inputs_ledgers,
        labels=get_pseudo_labels,
    output:
        model="results/{dataset}/{run}/student.pt",
        ledger="results/{dataset}/{run}/student.ledger.json",
        losses="results/{dataset}/{run}/student_loss.csv",
        plot=report(
            "results/{dataset}/{run}/student_loss.png",
            category="Training",
            caption="../report/loss.rst",
        ),
    params:
        settings=get_student_settings,
        target_epsilon=lambda wc: get_run(wc)["target_epsilon"],
        delta=lambda wc: get_run(wc)["delta"],
        labels=config["labels"],
        device=config["device"],
    log:
        "logs/{dataset}/distill_student_{run}.log",
    benchmark:
        "logs/{dataset}/distill_student_{run}.bench.tsv"
    threads: 2
    resources:
        mem_mb=12000,
        runtime=600,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/distill_student.py"
