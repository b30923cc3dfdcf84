# The empirical privacy audit (target `audit`, not part of `all`): see src/dpsad/audit/.
# Every configured name may be audited; audit.runs is checked when the target is built.
AUDIT_NAMES = [
    run["name"] for run in list(config["runs"]) + list(config["audit"]["extra_runs"])
]


wildcard_constraints:
    audited="|".join(map(re.escape, AUDIT_NAMES)) or "^$",


rule audit:
    input:
        get_audit_outputs,
        "results/audit.md",


rule audit_run:
    input:
        unpack(with_upstream_ledgers(data=PREPARED_DATA, teacher=get_audit_teacher)),
    output:
        audit="results/{dataset}/{audited}/audit.json",
        plot=report(
            "results/{dataset}/{audited}/audit_scores.png",
            category="Privacy audit",
            caption="../report/audit.rst",
            labels={
                "dataset": "{dataset}",
                "run": "{audited}",
                "figure": "audit scores",
            },
        ),
    log:
        "logs/{dataset}/audit_{audited}.log",
    benchmark:
        "logs/{dataset}/audit_{audited}.bench.tsv"
    threads: rule_threads("audit_run")
    resources:
        cpus_per_task=rule_cpus("audit_run"),
        gpu=requested_gpus("audit_run"),
        mem_mb=requested("audit_run", "mem_mb"),
        runtime=requested("audit_run", "runtime"),
    params:
        run=get_audited_run,
        settings=get_audit_settings,
        audit={
            k: v for k, v in config["audit"].items() if k not in ("runs", "extra_runs")
        },
        labels=lambda wc: run_labels(config, get_audited_run(wc)),
        diffusion=config["diffusion"],
        dp_code=DP_CODE,
    script:
        "../scripts/audit.py"


rule audit_table:
    input:
        get_audit_outputs,
    output:
        md="results/audit.md",
    log:
        "logs/audit_table.log",
    localrule: True
    script:
        "../scripts/audit_table.py"
