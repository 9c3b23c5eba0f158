//! `ember average`: averages the weights of a run's newest checkpoints into a new checkpoint.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ember_trainer::say;

#[derive(Args)]
pub(crate) struct AverageArgs {
    run: PathBuf,
    /// How many of the newest checkpoints to average.
    #[arg(long, default_value_t = 5)]
    last: usize,
}

pub(crate) fn run(args: AverageArgs) -> Result<()> {
    let dir = ember_trainer::checkpoint::average(&args.run, args.last)?;
    say!(
        "averaged the newest {} checkpoints into {}",
        args.last,
        dir.display()
    );
    Ok(())
}
