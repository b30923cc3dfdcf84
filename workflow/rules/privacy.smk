rule account:
    input:
        data="results/{dataset}/data.h5",
        ledger=get_generator_ledger,
    output:
        privacy="results/{dataset}/{run}/privacy.json",
        plot=report(
            "results/{dataset}/{run}/epsilon.png",
            category="Privacy",
            caption="../report/epsilon.rst",
            labels={"dataset": "{dataset}", "run": "{run}", "figure": "epsilon"},
        ),
    log:
        "logs/{dataset}/account_{run}.log",
    benchmark:
        "logs/{dataset}/account_{run}.bench.tsv"
    localrule: True
    params:
        target_epsilon=lambda wc: get_run(wc)["target_epsilon"],
        delta=lambda wc: get_run(wc)["delta"],
        accountant=lambda wc: accountant_of(config, get_run(wc)),
        earlier_use=lambda wc: config["data"][wc.dataset]["earlier_use"],
    script:
        "../scripts/account.py"


# Curator-side: every recorded use of the dataset's private records, released or not (sweeps, audits and
# reruns included); `python -m dpsad.privacy.books.spent_log results/<dataset>` prints it at any time.
rule privacy_spent:
    input:
        # privacy.json of every configured run: each is written after the run's last training
        expand(
            "results/{{dataset}}/{run}/privacy.json",
            run=[run["name"] for run in config["runs"]],
        ),
    output:
        "results/{dataset}/spent.json",
    log:
        "logs/{dataset}/privacy_spent.log",
    localrule: True
    params:
        delta=get_dataset_delta,
    script:
        "../scripts/privacy_spent.py"
