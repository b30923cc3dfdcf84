# The release of each run listed in data.<dataset>.release: the only files meant to leave results/ (see
# src/dpsad/release_folder.py).  `snakemake release` builds the release folders and what they need, nothing else.
rule release:
    input:
        get_release_outputs,


# One budget per set of private records: every listed run's ledger composed with every earlier release of any
# of those records, from the curator's record (src/dpsad/privacy/books/curator_record.py: one database per curator, outside
# the workspace), which the job then extends; past the budget the job fails naming the run, and no release folder is
# built.  BUDGET.json states a total that depends on no private record; the check itself (which releases share
# records with this one) is the curator's, in results/.  A local rule: the record sits on the disk of the host that
# runs Snakemake.
rule release_budget:
    input:
        data=PREPARED_DATA,
        privacy=get_released_privacy,
        others=get_other_declaring_data,
    output:
        budget="release/{dataset}/BUDGET.json",
        check=RELEASE_CHECK,
    log:
        "logs/{dataset}/release_budget.log",
    localrule: True
    params:
        runs=lambda wc: dataset_release(wc.dataset),
        budget=lambda wc: config["data"][wc.dataset]["privacy_budget"],
        earlier_use=lambda wc: config["data"][wc.dataset]["earlier_use"],
        curator_dir=config["curator_dir"],
    script:
        "../scripts/release_budget.py"


# Write-protected once built: Snakemake will not overwrite a release (a rerun of a DP stage would read the
# private records again and spend budget again); remove the folder by hand to rebuild it on purpose.
rule release_run:
    input:
        synthetic="results/{dataset}/{run}/synthetic.h5",
        privacy="results/{dataset}/{run}/privacy.json",
        generator=get_generator,
        ledger=get_generator_ledger,
        budget=get_release_budget,
    output:
        protected(directory("release/{dataset}/{run}")),
    log:
        "logs/{dataset}/release_{run}.log",
    benchmark:
        "logs/{dataset}/release_{run}.bench.tsv"
    localrule: True
    params:
        include_generator=config["release"]["generator"],
    script:
        "../scripts/release.py"
