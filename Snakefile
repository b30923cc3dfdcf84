# dpsad: differentially private synthetic image data (DP-SAD and baselines).
# Wiring only: the configuration, its validation, the rule files and the targets.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/student.smk"
include: "workflow/rules/privacy.smk"
include: "workflow/rules/sample.smk"
include: "workflow/rules/evaluate.smk"


rule all:
    input:
        get_final_outputs(),
    default_target: True
