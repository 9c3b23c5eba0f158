//! `ember report`: regenerates an ablation's report.md, report.json and plots from its run
//! directories.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ember_trainer::tell;

use super::print_result;

#[derive(Args)]
pub(crate) struct ReportArgs {
    /// An `ember ablate` output directory (for length-report: a scripts/length-study.sh directory).
    pub dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn run(args: ReportArgs) -> Result<()> {
    let r = ember_experiment::report::report(&args.dir)?;
    for w in &r.warnings {
        tell!("warning: {w}");
    }
    print_result(args.json, &r, || {
        format!(
            "{} runs ({} finished, {} diverged, {} failed): wrote {}, {} and {} plots",
            r.counts.runs,
            r.counts.ok,
            r.counts.diverged,
            r.counts.failed,
            args.dir.join(ember_experiment::layout::REPORT_MD).display(),
            args.dir.join(ember_experiment::layout::REPORT_JSON).display(),
            r.plots.len() / 2
        )
    })
}
