//! `ember eval`: loss and perplexity of a run on a data split, with BLEU and chrF of its
//! translations for a seq2seq run, or (`--context N`) a language model's loss and attention
//! entropy by position in windows of N tokens.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use ember_model::Model;
use ember_sacrebleu::{BleuConfig, Tokenize};
use ember_trainer::context::{evaluate_context, ContextEval, ContextOptions};
use ember_trainer::tell;
use ember_trainer::translate::{score_split_under, SplitScores};
use ember_trainer::{evaluate, say, Split};

use super::decode::DecodeArgs;
use super::print_result;
use super::run_output::check_run_output;

/// `eval --context` bound: attention at N positions holds N² probabilities per head, so a
/// context of 65,536 is already gigabytes per window on a small model.
const MAX_CONTEXT: u64 = 65_536;

// `eval` decodes only translation runs, and its help says so.
#[derive(Args)]
#[command(
    mut_arg("beam", |a| a.help("Translation: beam size for BLEU/chrF (1 = greedy)")),
    mut_arg("length_penalty", |a| a.help(
        "Translation: length penalty, GNMT's α (0.6 or gnmt:0.6) or fairseq's lenpen (fairseq:1); \
         several, comma-separated, rank one search under each and report every one (--output and \
         the headline take the highest BLEU; choose on --split valid). Default: the run's or model \
         folder's eval.length_penalty, else 0.6"
    )),
    mut_arg("no_cache", |a| a.help(
        "Translation: decode without the KV cache (re-runs the decoder over the whole prefix at \
         every step; the same output, slower: for timing the cache)"
    )),
)]
pub(crate) struct EvalArgs {
    /// Which split to evaluate: valid or test.
    #[arg(long, default_value = "valid")]
    split: String,
    #[command(flatten)]
    decode: DecodeArgs,
    /// Translation: skip decoding (loss and perplexity only).
    #[arg(long)]
    no_bleu: bool,
    /// Translation: write the detokenised hypotheses to this file.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Translation: BLEU's tokenisation, as `ember bleu --tokenize`: 13a (sacreBLEU's default),
    /// intl, or none (for text that is tokenised already, e.g. Multi30k's *.lc.norm.tok.*).
    #[arg(long, default_value = "13a", value_parser = parse_tokenize)]
    tokenize: Tokenize,
    /// Language models: evaluate windows of N tokens of the validation split (past the training
    /// length too) and report loss and attention entropy by position.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_CONTEXT))]
    context: Option<u64>,
    /// With --context: log-n attention scaling on or off for this evaluation (default: as trained).
    #[arg(long, requires = "context", value_parser = ["on", "off"])]
    logn: Option<String>,
    /// With --context: at most this many windows (default: every whole window of the split).
    #[arg(long, requires = "context", value_parser = clap::value_parser!(u64).range(1..))]
    max_windows: Option<u64>,
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: EvalArgs) -> Result<()> {
    let split: Split = args.split.parse()?;
    if let Some(path) = &args.output {
        check_run_output(path, &args.decode.run, "--output")?;
    }
    if let Some(context) = args.context {
        if split != Split::Valid {
            bail!("--context evaluates the validation split (text corpora have no test split)");
        }
        return eval_context(&args, context);
    }
    let run = args.decode.open()?;
    let r = evaluate(&run.model, &run.data, &run.cfg, split, &run.device)?;
    let mut out = serde_json::json!({
        "checkpoint": run.checkpoint,
        "split": args.split,
        "loss": r.loss,
        "ppl": r.ppl,
        "tokens": r.tokens,
    });
    let mut lines = vec![format!(
        "{} | {} | loss {:.4} | ppl {:.3} | {} tokens",
        run.checkpoint.display(),
        args.split,
        r.loss,
        r.ppl,
        r.tokens
    )];
    if let (Model::Seq2seq(m), Some(splits), false) =
        (&run.model, run.data.splits.translation(), args.no_bleu)
    {
        let pairs = match split {
            Split::Valid => &splits.valid,
            Split::Test => splits
                .test
                .as_ref()
                .context("this run's corpus has no test split")?,
        };
        let beam = args.decode.beam_config(&run.cfg);
        let penalties = &args.decode.penalties(&beam);
        if penalties.len() > 1 && split == Split::Test {
            tell!(
                "warning: comparing {} length penalties on the test split; choose one on \
                 `--split valid` and score test with it alone, or the test score is no longer held out",
                penalties.len()
            );
        }
        let bleu = BleuConfig {
            tokenize: args.tokenize,
            ..BleuConfig::default()
        };
        let all = score_split_under(
            m,
            &run.data.tokenizer,
            pairs,
            &beam,
            penalties,
            &bleu,
            None,
            &run.device,
        )?;
        // The first of the highest BLEU: ties go to the penalty listed first.
        let best = (0..all.len())
            .rev()
            .max_by(|&a, &b| all[a].bleu.score.total_cmp(&all[b].bleu.score))
            .context("no length penalty to score")?;
        report_scores(&args, &all, best, &mut lines, &mut out)?;
    }
    print_result(args.json, &out, || lines.join("\n"))
}

/// The scores of the length penalty `best` (the highest BLEU) as the text `lines` and JSON `out`
/// report them, with every penalty's line when several were ranked; its hypotheses into
/// `--output`.
fn report_scores(
    args: &EvalArgs,
    all: &[SplitScores],
    best: usize,
    lines: &mut Vec<String>,
    out: &mut serde_json::Value,
) -> Result<()> {
    let scores = &all[best];
    if let Some(path) = &args.output {
        ember_data::io::write_atomic(path, (scores.hypotheses.join("\n") + "\n").as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if all.len() > 1 {
        for s in all {
            lines.push(format!(
                "length penalty {:<12} BLEU {:6.2}  BP {:.3}  ratio {:.3}  chrF {:6.2}",
                s.length_penalty.to_string(),
                s.bleu.score,
                s.bleu.bp,
                s.bleu.ratio,
                s.chrf.score
            ));
        }
        lines.push(format!(
            "highest BLEU under length penalty {}:",
            scores.length_penalty
        ));
    }
    lines.push(scores.bleu.format());
    lines.push(scores.chrf.format());
    lines.push(format!(
        "decoded {} sentences with beam {}{} in {:.1}s ({:.1} sentences/s)",
        scores.sentences,
        args.decode.beam,
        if args.decode.no_cache {
            ", without the KV cache,"
        } else {
            ""
        },
        scores.secs,
        scores.sentences as f64 / scores.secs.max(1e-9)
    ));
    out["bleu"] = serde_json::to_value(&scores.bleu)?;
    out["chrf"] = serde_json::to_value(&scores.chrf)?;
    out["length_penalty"] = scores.length_penalty.to_string().into();
    if all.len() > 1 {
        out["length_penalties"] = serde_json::to_value(all)?;
    }
    out["beam"] = args.decode.beam.into();
    out["kv_cache"] = (!args.decode.no_cache).into();
    out["sentences_per_sec"] = (scores.sentences as f64 / scores.secs.max(1e-9)).into();
    Ok(())
}

/// `ember eval --context N`: a language model's loss and attention entropy by position.
fn eval_context(args: &EvalArgs, context: u64) -> Result<()> {
    let mut run = args.decode.open()?;
    let opts = ContextOptions {
        context: context as usize,
        logn: args.logn.as_deref().map(|v| v == "on"),
        max_windows: args.max_windows.map(|w| w as usize),
    };
    let r = evaluate_context(&mut run, opts)?;
    if args.json {
        let mut out = serde_json::to_value(&r)?;
        out["checkpoint"] = serde_json::to_value(&run.checkpoint)?;
        say!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        say!("{}", context_lines(&run.checkpoint, &r).join("\n"));
    }
    Ok(())
}

/// `ember eval --context` as text: the headline, then a line per position bucket.
fn context_lines(checkpoint: &Path, r: &ContextEval) -> Vec<String> {
    let logn = match r.logn_length {
        Some(m) => format!("log-n scaling on (m = {m})"),
        None => "log-n scaling off".to_string(),
    };
    let beyond = if r.beyond_training {
        format!(
            "{:.1}x the training length {}: positions past it were never trained on",
            r.context as f64 / r.train_length as f64,
            r.train_length
        )
    } else {
        format!("within the training length {}", r.train_length)
    };
    let mut lines = vec![format!(
        "{} | valid | context {} ({beyond}) | {logn} | loss {:.4} | ppl {:.3} | {} windows, {} tokens",
        checkpoint.display(),
        r.context,
        r.loss,
        r.ppl,
        r.windows,
        r.tokens
    )];
    for b in &r.buckets {
        lines.push(format!(
            "  positions {:>5}..{:<5} loss {:.4}  attention entropy {:.3} nats",
            b.first, b.last, b.loss, b.entropy
        ));
    }
    lines
}

/// `--tokenize`: a sacreBLEU tokenizer name.
fn parse_tokenize(s: &str) -> std::result::Result<Tokenize, String> {
    s.parse().map_err(|e| format!("{e}"))
}
