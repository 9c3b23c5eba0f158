//! A trained run to decode with, and how: the arguments `eval` and `translate` share.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ember_model::{BeamConfig, LengthPenalty};
use ember_trainer::config::RunConfig;
use ember_trainer::{eval_beam, open_model, open_run, OpenModel, OpenRun};

/// `--beam` bound: the one `eval.beam` has (beam search keeps beam × vocabulary scores per
/// sentence; beyond a few dozen it stops helping, and a beam of 100,000 needs gigabytes).
const MAX_BEAM: i64 = ember_trainer::config::MAX_BEAM as i64;

/// A trained run to decode with, and how: the options `eval` and `translate` share.
#[derive(Args)]
pub(super) struct DecodeArgs {
    /// A run directory (its newest checkpoint), a checkpoint directory inside it, or a model
    /// folder (`ember package`).
    pub run: PathBuf,
    /// Beam size (1 = greedy; at most 1024).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=MAX_BEAM))]
    pub beam: u32,
    /// Length penalty: GNMT's α (`0.6`, `gnmt:0.6`: logprob / ((5 + len) / 6)^α) or fairseq's
    /// `--lenpen` (`fairseq:1`: logprob / len^p) [default: the run's or folder's
    /// `eval.length_penalty`, else 0.6].
    #[arg(long, value_delimiter = ',', value_parser = parse_penalty)]
    pub length_penalty: Vec<LengthPenalty>,
    /// Decode without the KV cache (same output, slower: for timing the cache).
    #[arg(long)]
    pub no_cache: bool,
    /// Run on this device instead of the run's own: `cpu` or `cuda:N`.
    #[arg(long)]
    device: Option<String>,
}

impl DecodeArgs {
    /// The model with the data its config names, for evaluation.
    pub fn open(&self) -> Result<OpenRun> {
        open_run(&self.run, self.device.as_deref())
    }

    /// The model and its tokenizer alone, for decoding (the corpus is not read).
    pub fn open_model(&self) -> Result<OpenModel> {
        open_model(&self.run, self.device.as_deref())
    }

    /// The run's evaluation decoder with these options (the first length penalty given, else
    /// the run's own; a command that scores several ranks the same search under each).
    pub fn beam_config(&self, cfg: &RunConfig) -> BeamConfig {
        let mut beam = eval_beam(cfg, self.beam as usize);
        if let Some(&penalty) = self.length_penalty.first() {
            beam.length_penalty = penalty;
        }
        beam.use_cache = !self.no_cache;
        beam
    }

    /// The length penalties to rank `beam`'s search under: those given, or else the one
    /// [`beam_config`](Self::beam_config) took from the run (or model folder).
    pub fn penalties(&self, beam: &BeamConfig) -> Vec<LengthPenalty> {
        if self.length_penalty.is_empty() {
            vec![beam.length_penalty]
        } else {
            self.length_penalty.clone()
        }
    }
}

/// `--length-penalty` values: `gnmt:α`, `fairseq:p` or a bare α.
fn parse_penalty(s: &str) -> std::result::Result<LengthPenalty, String> {
    s.parse()
}
