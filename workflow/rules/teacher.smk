rule train_teacher:
    input:
        data="results/{dataset}/data.h5",
        labels=get_pseudo_labels,
    output:
        model="results/{dataset}/teacher/{teacher}.pt",
        ledger="results/{dataset}/teacher/{teacher}.ledger.json",
        losses="results/{dataset}/teacher/{teacher}.loss.csv",
        plot=report(
            "results/{dataset}/teacher/{teacher}.loss.png",
            category="Training",
            caption="../report/loss.rst",
        ),
    params:
        settings=get_teacher_settings,
        diffusion=config["diffusion"],
        labels=config["labels"],
        device=config["device"],
    log:
        "logs/{dataset}/train_teacher_{teacher}.log",
    benchmark:
        "logs/{dataset}/train_teacher_{teacher}.bench.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=240,
    script:
        "../scripts/train_teacher.py"
