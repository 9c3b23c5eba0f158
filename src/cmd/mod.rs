//! One module per `ember` command, each holding its arguments and its `run`; and what the
//! commands share: how a result is printed, and how a command that trains loads its config and
//! joins a data-parallel job.

pub(crate) mod ablate;
pub(crate) mod average;
pub(crate) mod bench;
pub(crate) mod bleu;
pub(crate) mod config;
mod decode;
pub(crate) mod eval;
pub(crate) mod export;
pub(crate) mod generate;
pub(crate) mod length_report;
pub(crate) mod package;
pub(crate) mod report;
mod run_output;
pub(crate) mod tokenize;
pub(crate) mod train;
pub(crate) mod translate;

use std::path::Path;
use std::rc::Rc;

use anyhow::Result;
use ember_distributed::World;
use ember_trainer::config::RunConfig;
use ember_trainer::{say, tell};
use serde::Serialize;

/// Prints a command's result: `value` as pretty JSON with `--json`, else the text `text` makes.
fn print_result(json: bool, value: &impl Serialize, text: impl FnOnce() -> String) -> Result<()> {
    if json {
        say!("{}", serde_json::to_string_pretty(value)?);
    } else {
        say!("{}", text());
    }
    Ok(())
}

/// Loads a config and joins the job the launcher started (a world of one without one), before
/// anything else runs; rank 0 alone prints the config's warnings.
fn load_and_join(config: &Path, set: &[String]) -> Result<(RunConfig, Rc<World>)> {
    let cfg = RunConfig::load(config, set)?;
    let timeout = std::time::Duration::from_secs(cfg.distributed.timeout_secs);
    let world = Rc::new(World::from_launcher(timeout)?);
    if world.is_leader() {
        for warning in cfg.warnings() {
            tell!("warning: {warning}");
        }
    }
    Ok((cfg, world))
}
