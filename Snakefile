# dpsad: differentially private synthetic image data (DP-SAD and baselines).
# Wiring only: the configuration, its validation, the rule files and the targets.
from snakemake.utils import min_version

min_version("9.0")


# The default run.  Files given with --configfile are merged over it in order (lists such as `runs`
# are replaced whole); --replace-workflow-config drops it instead.
configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/moco.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/student.smk"
include: "workflow/rules/baselines.smk"
include: "workflow/rules/privacy.smk"
include: "workflow/rules/sample.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/release.smk"
include: "workflow/rules/audit.smk"


rule all:
    default_target: True
    input:
        get_final_outputs,
