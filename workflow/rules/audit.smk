# The empirical privacy audit (target `audit`, not part of `all`): see src/dpsad/audit/.
# Every configured name may be audited; audit.runs is checked when the target is built.
AUDIT_NAMES = [run["name"] for run in list(config["runs"]) + list(config["audit"]["extra_runs"])]


wildcard_constraints:
    audited="|".join(map(re.escape, AUDIT_NAMES)) or "^$",


rule audit:
    input:
        get_audit_outputs,
        "results/audit.md",


rule audit_run:
    input:
        data="results/{dataset}/data.h5",
        teacher=get_audit_teacher,
        upstream_ledgers=get_audit_upstream_ledgers,
    output:
        audit="results/{dataset}/{audited}/audit.json",
        plot=report(
            "results/{dataset}/{audited}/audit_scores.png",
            category="Privacy audit",
            caption="../report/audit.rst",
        ),
    params:
        run=get_audited_run,
        settings=lambda wc: method_settings(config, get_audited_run(wc)),
        audit={k: v for k, v in config["audit"].items() if k not in ("runs", "extra_runs")},
        labels=config["labels"],
        diffusion=config["diffusion"],
        device=config["device"],
    log:
        "logs/{dataset}/audit_{audited}.log",
    benchmark:
        "logs/{dataset}/audit_{audited}.bench.tsv"
    threads: 2
    resources:
        mem_mb=12000,
        runtime=120,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/audit.py"


rule audit_table:
    input:
        get_audit_outputs,
    output:
        md="results/audit.md",
    log:
        "logs/audit_table.log",
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        "../../envs/dpsad.yaml"
    script:
        "../scripts/audit_table.py"
