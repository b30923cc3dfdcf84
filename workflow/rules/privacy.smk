rule account:
    input:
        data="results/{dataset}/data.h5",
        ledgers=get_run_ledgers,
    output:
        privacy="results/{dataset}/{run}/privacy.json",
        plot=report(
            "results/{dataset}/{run}/epsilon.png",
            category="Privacy",
            caption="../report/epsilon.rst",
        ),
    params:
        target_epsilon=lambda wc: get_run(wc)["target_epsilon"],
        delta=lambda wc: get_run(wc)["delta"],
        accountant=get_accountant,
        labels=config["labels"],
    log:
        "logs/{dataset}/account_{run}.log",
    benchmark:
        "logs/{dataset}/account_{run}.bench.tsv"
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/account.py"
