# Baselines trained on the same data and budget: DPDM (DP-SGD diffusion) and dp-GAN.
rule train_dpdm:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA, labels=get_pseudo_labels, init=get_dpdm_init
            )
        ),
    output:
        model="results/{dataset}/{run}/dpdm.pt",
        ledger="results/{dataset}/{run}/dpdm.ledger.json",
        losses="results/{dataset}/{run}/dpdm_loss.csv",
        plot=report(
            "results/{dataset}/{run}/dpdm_loss.png",
            category="Training",
            caption="../report/loss.rst",
            labels={"dataset": "{dataset}", "run": "{run}", "figure": "dpdm loss"},
        ),
    log:
        "logs/{dataset}/train_dpdm_{run}.log",
    benchmark:
        "logs/{dataset}/train_dpdm_{run}.bench.tsv"
    threads: rule_threads("train_dpdm")
    resources:
        cpus_per_task=rule_cpus("train_dpdm"),
        gpu=requested_gpus("train_dpdm"),
        mem_mb=requested("train_dpdm", "mem_mb"),
        runtime=requested("train_dpdm", "runtime"),
    params:
        settings=get_dpdm_settings,
        diffusion=config["diffusion"],
        labels=get_run_labels,
        dp_code=DP_CODE,
    script:
        "../scripts/train_dpdm.py"


rule train_dpgan:
    input:
        unpack(with_upstream_ledgers(data=PREPARED_DATA, labels=get_pseudo_labels)),
    output:
        model="results/{dataset}/{run}/dpgan.pt",
        ledger="results/{dataset}/{run}/dpgan.ledger.json",
        losses="results/{dataset}/{run}/dpgan_loss.csv",
        plot=report(
            "results/{dataset}/{run}/dpgan_loss.png",
            category="Training",
            caption="../report/loss.rst",
            labels={"dataset": "{dataset}", "run": "{run}", "figure": "dpgan loss"},
        ),
    log:
        "logs/{dataset}/train_dpgan_{run}.log",
    benchmark:
        "logs/{dataset}/train_dpgan_{run}.bench.tsv"
    threads: rule_threads("train_dpgan")
    resources:
        cpus_per_task=rule_cpus("train_dpgan"),
        gpu=requested_gpus("train_dpgan"),
        mem_mb=requested("train_dpgan", "mem_mb"),
        runtime=requested("train_dpgan", "runtime"),
    params:
        settings=get_dpgan_settings,
        labels=get_run_labels,
        dp_code=DP_CODE,
    script:
        "../scripts/train_dpgan.py"


# Private Evolution: the run's teacher's images (or its own DPDM training's, pe.dpdm_share), chosen and varied by
# noisy vote histograms (src/dpsad/privacy/mechanism/histogram.py).
rule train_pe:
    input:
        unpack(
            with_upstream_ledgers(
                data=PREPARED_DATA, labels=get_pseudo_labels, teacher=get_pe_generator
            )
        ),
    output:
        model="results/{dataset}/{run}/pe.pt",
        ledger="results/{dataset}/{run}/pe.ledger.json",
        votes="results/{dataset}/{run}/pe_votes.csv",
    log:
        "logs/{dataset}/train_pe_{run}.log",
    benchmark:
        "logs/{dataset}/train_pe_{run}.bench.tsv"
    threads: rule_threads("train_pe")
    resources:
        cpus_per_task=rule_cpus("train_pe"),
        gpu=requested_gpus("train_pe"),
        mem_mb=requested("train_pe", "mem_mb"),
        runtime=requested("train_pe", "runtime"),
    params:
        settings=get_pe_settings,
        labels=get_run_labels,
        pe_code=get_pe_code,
    script:
        "../scripts/train_pe.py"
