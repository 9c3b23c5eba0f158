//! `ember config`: the run config's JSON Schema (which editors read for completion and checking),
//! its reference page, and a config resolved with every default and the source of each value.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use ember_trainer::config::{json_schema_text, reference_markdown, RunConfig, REFERENCE_FILE, SCHEMA_FILE};
use ember_trainer::say;

#[derive(Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the JSON Schema of a run config (committed as configs/ember.schema.json).
    #[command(after_help = "Examples:\n  \
        ember config schema                                # print it\n  \
        ember config schema --output configs/ember.schema.json")]
    Schema(OutputArgs),
    /// Print the config reference page (committed as docs/guide/reference/config.md).
    #[command(after_help = "Examples:\n  \
        ember config reference | less\n  \
        ember config reference --output docs/guide/reference/config.md")]
    Reference(OutputArgs),
    /// Print a config with every default filled in and where each value came from (the file,
    /// --set, the model folder of model.init_from, or the default).
    #[command(after_help = "Examples:\n  \
        ember config show configs/quickstart.yaml\n  \
        ember config show configs/quickstart.yaml --set model.qk_norm=rmsnorm --json")]
    Show(ShowArgs),
}

#[derive(Args)]
struct OutputArgs {
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct ShowArgs {
    /// The YAML config.
    config: PathBuf,
    /// Override a config key, e.g. `--set train.lr=3e-3` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Print `{"config": ..., "sources": {"train.lr": "file", ...}}` as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: ConfigArgs) -> Result<()> {
    match args.command {
        ConfigCommand::Schema(out) => emit(&json_schema_text(), out, SCHEMA_FILE),
        ConfigCommand::Reference(out) => emit(&reference_markdown(), out, REFERENCE_FILE),
        ConfigCommand::Show(args) => {
            let shown = RunConfig::show(&args.config, &args.set)?;
            if args.json {
                say!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                let sets: String = args.set.iter().map(|s| format!(" --set {s}")).collect();
                say!(
                    "# {}{sets}, resolved: every key, each value followed by where it came from\n{}",
                    args.config.display(),
                    shown.to_commented_yaml().trim_end()
                );
            }
            Ok(())
        }
    }
}

/// Prints `text`, or writes it (whole, atomically) to `--output`; `committed` names the file the
/// repository keeps, for the message.
fn emit(text: &str, out: OutputArgs, committed: &str) -> Result<()> {
    let Some(path) = out.output else {
        say!("{}", text.trim_end());
        return Ok(());
    };
    ember_data::io::check_output(&path, &[], "--output")?;
    ember_data::io::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("cannot write {}: {}", path.display(), "nothing was changed"))?;
    say!(
        "wrote {} ({} bytes; the repository keeps it as {committed})",
        path.display(),
        text.len()
    );
    Ok(())
}
