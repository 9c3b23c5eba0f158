//! `ember length-report`: reports a length-generalisation study (scripts/length-study.sh):
//! loss by context and position, per QK-norm variant, with log-n scaling off and on.

use anyhow::Result;

use super::print_result;
use super::report::ReportArgs;

pub(crate) fn run(args: ReportArgs) -> Result<()> {
    let r = ember_experiment::length::length_report(&args.dir)?;
    for w in &r.warnings {
        ember_trainer::tell!("warning: {w}");
    }
    print_result(args.json, &r, || {
        format!(
            "{} variants x {} seeds x log-n off/on at contexts {:?} (trained at {}): wrote {}, {} and {} plots",
            r.variants.len(),
            r.seeds.len(),
            r.contexts,
            r.train_length,
            args.dir.join(ember_experiment::layout::REPORT_MD).display(),
            args.dir.join(ember_experiment::layout::REPORT_JSON).display(),
            r.plots.len() / 2
        )
    })
}
