//! The length-generalisation study's report (`ember length-report DIR`): how the loss of
//! language models trained at one length behaves at longer contexts, per QK-norm variant, with
//! log-n attention scaling off and on.
//!
//! `scripts/length-study.sh` fills `DIR`: `DIR/sweep` is an `ember ablate` sweep (variants ×
//! seeds at one learning rate), and `DIR/evals/<run>/context-<N>-logn-<on|off>.json` holds
//! `ember eval <run> --context N --logn on|off --json` of every run. Log-n scaling is a no-op at
//! the training length, so one trained model serves both arms. This module pairs the
//! evaluations by seed and writes `report.md`, `report.json` and `plots/`:
//! - validation loss at every context, mean and 95% t interval over seeds, per arm;
//! - the paired effect of log-n (on − off) and of each QK-norm variant (− none) per context;
//! - the reach: loss at each longer context minus loss at the training length, per seed;
//! - attention entropy by position bucket at the longest context, against what entropy
//!   invariance predicts (flat past the training length with log-n);
//! - plots of loss vs context, and of loss and attention entropy by position.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ember_trainer::context::ContextEval;
use ember_trainer::{RunConfig, RUN_CONFIG};
use serde::Serialize;

use crate::layout::{variant_name, write_json, PLOTS, REPORT_JSON, REPORT_MD, RUNS, VARIANT_ORDER};
use crate::report::plots::{band, color, register_font, write_figure, Figure, Series};
use crate::report::stats::{mean_std, paired_diff, t_half_width, PairedDiff};

/// Where the evaluations live inside the study directory.
pub const EVALS: &str = "evals";
/// Where the sweep of trained runs lives inside the study directory.
pub const SWEEP: &str = "sweep";
/// Where `ember bleu --source --json` of translation runs lives inside the study directory
/// (`<variant>-lr<LR>-seed<S>.json`, one per run).
pub const MULTI30K: &str = "multi30k";

/// One evaluation of one run.
#[derive(Debug, Clone)]
struct Eval {
    variant: String,
    seed: u64,
    logn: bool,
    result: ContextEval,
}

/// One arm's validation loss at one context: mean over seeds and the 95% t interval half-width.
#[derive(Debug, Clone, Serialize)]
pub struct ArmLoss {
    pub variant: String,
    pub logn: bool,
    pub context: usize,
    pub mean: f64,
    /// Half-width of the 95% t interval (`None` with one seed).
    pub ci95: Option<f64>,
    pub seeds: usize,
}

/// A paired difference at one context.
#[derive(Debug, Clone, Serialize)]
pub struct Effect {
    /// What is compared, e.g. "rmsnorm: log-n on − off" or "rmsnorm − none (log-n on)".
    pub what: String,
    pub context: usize,
    pub diff: PairedDiff,
}

/// Attention entropy of one arm in one position bucket at the longest context.
#[derive(Debug, Clone, Serialize)]
pub struct BucketEntropy {
    pub variant: String,
    pub logn: bool,
    pub first: usize,
    pub last: usize,
    pub entropy: f64,
    pub loss: f64,
}

/// BLEU of one translation variant in one source-length bucket: mean over seeds, and the
/// paired difference to `none`.
#[derive(Debug, Clone, Serialize)]
pub struct BleuBucket {
    pub variant: String,
    /// Source words, inclusive; `last` = `None`: open-ended.
    pub first: usize,
    pub last: Option<usize>,
    pub sentences: usize,
    pub bleu: f64,
    pub seeds: usize,
    pub vs_none: Option<PairedDiff>,
}

/// Everything the report says, as `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct LengthReport {
    pub train_length: usize,
    pub contexts: Vec<usize>,
    pub variants: Vec<String>,
    pub seeds: Vec<u64>,
    pub losses: Vec<ArmLoss>,
    pub logn_effects: Vec<Effect>,
    pub qk_norm_effects: Vec<Effect>,
    /// Loss at each context minus loss at the training length, per arm.
    pub reach: Vec<Effect>,
    pub entropy_buckets: Vec<BucketEntropy>,
    /// BLEU by source length of translation runs, when `DIR/multi30k` holds them.
    pub bleu_by_source_length: Vec<BleuBucket>,
    pub plots: Vec<String>,
}

/// Reads the study in `dir` and writes `report.md`, `report.json` and the plots there.
pub fn length_report(dir: &Path) -> Result<LengthReport> {
    let evals = read_evals(dir)?;
    let train_length = evals[0].result.train_length;
    if let Some(e) = evals.iter().find(|e| e.result.train_length != train_length) {
        bail!(
            "the runs were trained at different lengths ({} and {train_length}, e.g. {} seed {}); \
             a length study compares one training length",
            e.result.train_length,
            e.variant,
            e.seed
        );
    }
    let contexts: Vec<usize> = evals
        .iter()
        .map(|e| e.result.context)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let seeds: Vec<u64> = evals
        .iter()
        .map(|e| e.seed)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let variants = variant_order(evals.iter().map(|e| e.variant.clone()));
    let by_key: BTreeMap<(String, bool, usize, u64), &ContextEval> = evals
        .iter()
        .map(|e| ((e.variant.clone(), e.logn, e.result.context, e.seed), &e.result))
        .collect();
    let per_seed = |variant: &str, logn: bool, context: usize| -> Vec<Option<f64>> {
        seeds
            .iter()
            .map(|&s| {
                by_key
                    .get(&(variant.to_string(), logn, context, s))
                    .map(|r| r.loss)
            })
            .collect()
    };

    let mut losses = Vec::new();
    let mut logn_effects = Vec::new();
    let mut qk_norm_effects = Vec::new();
    let mut reach = Vec::new();
    for &context in &contexts {
        for v in &variants {
            for logn in [false, true] {
                let xs: Vec<f64> = per_seed(v, logn, context).into_iter().flatten().collect();
                if let Some(ms) = mean_std(&xs) {
                    let ci95 = t_half_width(&ms, 0.95);
                    losses.push(ArmLoss {
                        variant: v.clone(),
                        logn,
                        context,
                        mean: ms.mean,
                        ci95,
                        seeds: ms.n,
                    });
                }
                if context != train_length {
                    let at = per_seed(v, logn, context);
                    let base = per_seed(v, logn, train_length);
                    if let Some(diff) = paired_diff(&at, &base, 0.95) {
                        reach.push(Effect {
                            what: format!(
                                "{v}, log-n {}: loss at {context} − at {train_length}",
                                on_off(logn)
                            ),
                            context,
                            diff,
                        });
                    }
                }
            }
            if let Some(diff) = paired_diff(&per_seed(v, true, context), &per_seed(v, false, context), 0.95) {
                logn_effects.push(Effect {
                    what: format!("{v}: log-n on − off"),
                    context,
                    diff,
                });
            }
            if v != "none" {
                for logn in [false, true] {
                    if let Some(diff) = paired_diff(
                        &per_seed(v, logn, context),
                        &per_seed("none", logn, context),
                        0.95,
                    ) {
                        qk_norm_effects.push(Effect {
                            what: format!("{v} − none (log-n {})", on_off(logn)),
                            context,
                            diff,
                        });
                    }
                }
            }
        }
    }

    let longest = *contexts.last().context("no evaluations")?;
    let mut entropy_buckets = Vec::new();
    for v in &variants {
        for logn in [false, true] {
            let runs: Vec<&ContextEval> = seeds
                .iter()
                .filter_map(|&s| by_key.get(&(v.clone(), logn, longest, s)).copied())
                .collect();
            let Some(first) = runs.first() else { continue };
            for (i, b) in first.buckets.iter().enumerate() {
                let mean = |f: &dyn Fn(&ContextEval) -> f64| {
                    runs.iter().map(|r| f(r)).sum::<f64>() / runs.len() as f64
                };
                entropy_buckets.push(BucketEntropy {
                    variant: v.clone(),
                    logn,
                    first: b.first,
                    last: b.last,
                    entropy: mean(&|r| r.buckets[i].entropy),
                    loss: mean(&|r| r.buckets[i].loss),
                });
            }
        }
    }

    let bleu_by_source_length = bleu_buckets(&dir.join(MULTI30K))?;
    let plots = write_length_plots(dir, &variants, &contexts, &evals, longest)?;
    let report = LengthReport {
        train_length,
        contexts,
        variants,
        seeds,
        losses,
        logn_effects,
        qk_norm_effects,
        reach,
        entropy_buckets,
        bleu_by_source_length,
        plots,
    };
    write_json(&dir.join(REPORT_JSON), &report)?;
    let md_path = dir.join(REPORT_MD);
    ember_data::io::write_atomic(&md_path, markdown(&report).as_bytes())
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(report)
}

/// BLEU per variant and source-length bucket from `ember bleu --source --json` files named after
/// their runs (`none-lr5e-3-seed1.json`); empty when `dir` does not exist.
fn bleu_buckets(dir: &Path) -> Result<Vec<BleuBucket>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    // (variant, (first, last)) -> seed -> (BLEU, sentences)
    type Scores = BTreeMap<(String, (usize, Option<usize>)), BTreeMap<u64, (f64, usize)>>;
    let mut scores: Scores = BTreeMap::new();
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|f| f.ok().map(|f| f.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for file in files {
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let (Some(variant), Some(seed)) = (
            stem.split("-lr").next(),
            stem.rsplit("-seed").next().and_then(|s| s.parse::<u64>().ok()),
        ) else {
            bail!("{}: expected a run name like none-lr5e-3-seed1", file.display());
        };
        let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not `ember bleu --json` output", file.display()))?;
        let buckets = json["bleu_by_source_length"].as_array().with_context(|| {
            format!(
                "{} has no bleu_by_source_length (run ember bleu with --source)",
                file.display()
            )
        })?;
        for b in buckets {
            let (Some(first), Some(bleu), Some(sentences)) = (
                b["first"].as_u64(),
                b["score"]["score"].as_f64(),
                b["sentences"].as_u64(),
            ) else {
                bail!("{}: a bucket without first, score or sentences", file.display());
            };
            let key = (
                variant.to_string(),
                (first as usize, b["last"].as_u64().map(|l| l as usize)),
            );
            scores
                .entry(key)
                .or_default()
                .insert(seed, (bleu, sentences as usize));
        }
    }
    let variants = variant_order(scores.keys().map(|(v, _)| v.clone()));
    let ranges: BTreeSet<(usize, Option<usize>)> = scores.keys().map(|(_, r)| *r).collect();
    let mut out = Vec::new();
    for v in &variants {
        for &range in &ranges {
            let Some(by_seed) = scores.get(&(v.clone(), range)) else {
                continue;
            };
            let xs: Vec<f64> = by_seed.values().map(|x| x.0).collect();
            let Some(ms) = mean_std(&xs) else { continue };
            let vs_none = match scores.get(&("none".to_string(), range)) {
                Some(base) if v != "none" => {
                    let seeds: BTreeSet<u64> = by_seed.keys().chain(base.keys()).copied().collect();
                    let a: Vec<Option<f64>> = seeds.iter().map(|s| by_seed.get(s).map(|x| x.0)).collect();
                    let b: Vec<Option<f64>> = seeds.iter().map(|s| base.get(s).map(|x| x.0)).collect();
                    paired_diff(&a, &b, 0.95)
                }
                _ => None,
            };
            out.push(BleuBucket {
                variant: v.clone(),
                first: range.0,
                last: range.1,
                sentences: by_seed.values().next().map_or(0, |x| x.1),
                bleu: ms.mean,
                seeds: ms.n,
                vs_none,
            });
        }
    }
    Ok(out)
}

fn on_off(logn: bool) -> &'static str {
    if logn {
        "on"
    } else {
        "off"
    }
}

/// Variants in the order of the seed's table: none first, then the norms.
fn variant_order(names: impl Iterator<Item = String>) -> Vec<String> {
    let set: BTreeSet<String> = names.collect();
    let rank = |v: &str| {
        VARIANT_ORDER
            .iter()
            .position(|x| *x == v)
            .unwrap_or(VARIANT_ORDER.len())
    };
    let mut v: Vec<String> = set.into_iter().collect();
    v.sort_by_key(|x| (rank(x), x.clone()));
    v
}

/// Every `DIR/evals/<run>/context-<N>-logn-<on|off>.json`, with the run's variant and seed from
/// `DIR/sweep/runs/<run>/config.yaml`.
fn read_evals(dir: &Path) -> Result<Vec<Eval>> {
    let evals_dir = dir.join(EVALS);
    let runs = fs::read_dir(&evals_dir).with_context(|| {
        format!(
            "reading {} (run scripts/length-study.sh first: it trains the sweep and evaluates it there)",
            evals_dir.display()
        )
    })?;
    let mut out = Vec::new();
    for run in runs {
        let run = run?.path();
        let Some(name) = run.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        if !run.is_dir() {
            continue;
        }
        let config = dir.join(SWEEP).join(RUNS).join(&name).join(RUN_CONFIG);
        let cfg = RunConfig::load(&config, &[]).with_context(|| format!("reading {}", config.display()))?;
        let variant = variant_name(cfg.model.qk_norm);
        let mut files: Vec<PathBuf> = fs::read_dir(&run)?
            .filter_map(|f| f.ok().map(|f| f.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for file in files {
            let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let result: ContextEval = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not an `ember eval --context --json` result",
                    file.display()
                )
            })?;
            out.push(Eval {
                variant: variant.clone(),
                seed: cfg.train.seed,
                logn: result.logn_attention,
                result,
            });
        }
    }
    if out.is_empty() {
        bail!("{} holds no evaluations", evals_dir.display());
    }
    Ok(out)
}

fn fmt_effect(d: &PairedDiff) -> String {
    match (d.ci_low, d.ci_high) {
        (Some(lo), Some(hi)) => format!("{:+.3} [{lo:+.3}, {hi:+.3}]", d.mean),
        _ => format!("{:+.3}", d.mean),
    }
}

fn markdown(r: &LengthReport) -> String {
    let mut md = String::new();
    let m = r.train_length;
    let _ = writeln!(
        md,
        "# Length generalisation: loss past the training length, by QK-norm variant and log-n scaling\n"
    );
    let _ = writeln!(
        md,
        "Language models trained at length m = {m}, evaluated on the validation split in windows of N \
         tokens (`ember eval RUN --context N --logn on|off`); {} seed{} per variant (paired: the same \
         seeds across variants). Log-n scaling multiplies a query that sees n > m keys by ln n / ln m; \
         it is a no-op at n ≤ m, so both arms of a variant are the same trained model. Intervals are \
         95% t intervals over seeds.\n",
        r.seeds.len(),
        if r.seeds.len() == 1 { "" } else { "s" }
    );
    let _ = writeln!(md, "## Validation loss by context (mean ± 95% CI half-width)\n");
    let header: Vec<String> = r.contexts.iter().map(|c| format!("N = {c}")).collect();
    let _ = writeln!(md, "| variant | log-n | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(r.contexts.len()));
    for v in &r.variants {
        for logn in [false, true] {
            let cells: Vec<String> = r
                .contexts
                .iter()
                .map(|&c| {
                    r.losses
                        .iter()
                        .find(|a| &a.variant == v && a.logn == logn && a.context == c)
                        .map_or("–".into(), |a| match a.ci95 {
                            Some(h) => format!("{:.3} ± {h:.3}", a.mean),
                            None => format!("{:.3}", a.mean),
                        })
                })
                .collect();
            let _ = writeln!(md, "| {v} | {} | {} |", on_off(logn), cells.join(" | "));
        }
    }
    let effect_table = |md: &mut String, title: &str, effects: &[Effect], contexts: &[usize]| {
        let _ = writeln!(md, "\n## {title}\n");
        let header: Vec<String> = contexts.iter().map(|c| format!("N = {c}")).collect();
        let _ = writeln!(md, "| comparison | {} |", header.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(contexts.len()));
        let whats: Vec<String> = {
            let mut seen = Vec::new();
            for e in effects {
                let key = e.what.split(": loss at").next().unwrap_or(&e.what).to_string();
                if !seen.contains(&key) {
                    seen.push(key);
                }
            }
            seen
        };
        for w in whats {
            let cells: Vec<String> = contexts
                .iter()
                .map(|&c| {
                    effects
                        .iter()
                        .find(|e| e.context == c && e.what.split(": loss at").next() == Some(w.as_str()))
                        .map_or("–".into(), |e| fmt_effect(&e.diff))
                })
                .collect();
            let _ = writeln!(md, "| {w} | {} |", cells.join(" | "));
        }
    };
    effect_table(
        &mut md,
        "Log-n scaling: loss with it on minus off (paired by seed; negative = log-n helps)",
        &r.logn_effects,
        &r.contexts,
    );
    effect_table(
        &mut md,
        "QK-norm: loss of each variant minus none (paired by seed; negative = the norm helps)",
        &r.qk_norm_effects,
        &r.contexts,
    );
    let longer: Vec<usize> = r.contexts.iter().copied().filter(|&c| c != m).collect();
    effect_table(
        &mut md,
        &format!(
            "Reach: loss at context N minus loss at the training length {m} (paired by seed; 0 = no worse)"
        ),
        &r.reach,
        &longer,
    );
    if let Some(&longest) = r.contexts.last() {
        let _ = writeln!(
            md,
            "\n## Attention entropy by position at N = {longest} (nats, mean over layers, heads, windows and seeds)\n"
        );
        let _ = writeln!(
            md,
            "Entropy invariance (the design behind log-n scaling) predicts that with log-n on the \
             entropy past position {m} stays at its level within 1..{m}; without it, attention \
             spreads over the longer context and its entropy grows with ln n.\n"
        );
        let buckets: Vec<(usize, usize)> = r
            .entropy_buckets
            .iter()
            .map(|b| (b.first, b.last))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let header: Vec<String> = buckets.iter().map(|(f, l)| format!("{f}..{l}")).collect();
        let _ = writeln!(md, "| variant | log-n | {} |", header.join(" | "));
        let _ = writeln!(md, "|---|---|{}", "---|".repeat(buckets.len()));
        for v in &r.variants {
            for logn in [false, true] {
                let cells: Vec<String> = buckets
                    .iter()
                    .map(|&(f, l)| {
                        r.entropy_buckets
                            .iter()
                            .find(|b| &b.variant == v && b.logn == logn && b.first == f && b.last == l)
                            .map_or("–".into(), |b| format!("{:.3}", b.entropy))
                    })
                    .collect();
                let _ = writeln!(md, "| {v} | {} | {} |", on_off(logn), cells.join(" | "));
            }
        }
    }
    if !r.bleu_by_source_length.is_empty() {
        let _ = writeln!(
            md,
            "\n## Translation: test BLEU by source length (Multi30k En→De test2016, the released runs of docs/results/multi30k-tiny)\n"
        );
        let _ = writeln!(
            md,
            "Source length in whitespace-separated words of the raw English source; `ember bleu --source` \
             scores each bucket's segments as a corpus (sacreBLEU's default signature). Mean over seeds; \
             the difference to none is paired by seed, with its 95% t interval.\n"
        );
        let _ = writeln!(md, "| variant | source words | sentences | BLEU | − none |");
        let _ = writeln!(md, "|---|---|---|---|---|");
        for b in &r.bleu_by_source_length {
            let range = match b.last {
                Some(l) => format!("{}–{l}", b.first),
                None => format!("{}+", b.first),
            };
            let diff = b.vs_none.as_ref().map_or("–".into(), fmt_effect);
            let _ = writeln!(
                md,
                "| {} | {range} | {} | {:.2} | {diff} |",
                b.variant, b.sentences, b.bleu
            );
        }
    }
    let _ = writeln!(md, "\n## Plots\n");
    for p in r.plots.iter().filter(|p| p.ends_with(".png")) {
        let _ = writeln!(md, "![{p}]({p})");
    }
    md
}

/// Loss vs context per variant, and loss and attention entropy by position at the longest
/// context, each for log-n off and on; mean over seeds, shaded min–max.
fn write_length_plots(
    dir: &Path,
    variants: &[String],
    contexts: &[usize],
    evals: &[Eval],
    longest: usize,
) -> Result<Vec<String>> {
    register_font()?;
    let plots = dir.join(PLOTS);
    fs::create_dir_all(&plots).with_context(|| format!("creating {}", plots.display()))?;
    let mut files = Vec::new();
    for logn in [false, true] {
        let runs_of = |v: &str, c: usize| -> Vec<&ContextEval> {
            evals
                .iter()
                .filter(|e| e.variant == v && e.logn == logn && e.result.context == c)
                .map(|e| &e.result)
                .collect()
        };
        let mut vs_context = Vec::new();
        let mut loss_pos = Vec::new();
        let mut entropy_pos = Vec::new();
        for (i, v) in variants.iter().enumerate() {
            let points: Vec<(f64, f64, f64, f64)> = contexts
                .iter()
                .filter_map(|&c| {
                    let xs: Vec<f64> = runs_of(v, c).iter().map(|r| r.loss).collect();
                    band(&xs).map(|(m, lo, hi)| (c as f64, m, lo, hi))
                })
                .collect();
            // A marker per seed, on top of the mean line and its min–max band.
            let markers = contexts
                .iter()
                .flat_map(|&c| runs_of(v, c).into_iter().map(move |r| (c as f64, r.loss, false)))
                .collect();
            vs_context.push(Series {
                label: v.clone(),
                color: color(v, i),
                points,
                markers,
            });
            let long = runs_of(v, longest);
            let by_position = |f: fn(&ContextEval) -> &[f64]| -> Vec<(f64, f64, f64, f64)> {
                (0..longest)
                    .filter_map(|p| {
                        let xs: Vec<f64> = long.iter().filter_map(|r| f(r).get(p).copied()).collect();
                        band(&xs).map(|(m, lo, hi)| ((p + 1) as f64, m, lo, hi))
                    })
                    .collect()
            };
            for (series, f) in [
                (&mut loss_pos, loss_of as fn(&ContextEval) -> &[f64]),
                (&mut entropy_pos, entropy_of),
            ] {
                series.push(Series {
                    label: v.clone(),
                    color: color(v, i),
                    points: by_position(f),
                    markers: Vec::new(),
                });
            }
        }
        let suffix = if logn { "logn_on" } else { "logn_off" };
        let mode = if logn {
            "log-n scaling on"
        } else {
            "log-n scaling off"
        };
        // Every figure here has lengths or positions on a log x axis and a linear y axis.
        let figure = |stem: &str, title: String, x_label: &str, y_label: &str, series| Figure {
            stem: format!("{stem}_{suffix}"),
            title: format!("{title} ({mode})"),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_log: true,
            y_log: false,
            x_steps: true,
            series,
            y_cap: None,
        };
        for fig in [
            figure(
                "loss_vs_context",
                "Validation loss vs context".into(),
                "context N (tokens)",
                "validation loss (nats)",
                vs_context,
            ),
            figure(
                "loss_by_position",
                format!("Loss by position at N = {longest}"),
                "position in window",
                "loss (nats)",
                loss_pos,
            ),
            figure(
                "entropy_by_position",
                format!("Attention entropy by position at N = {longest}"),
                "query position",
                "entropy (nats)",
                entropy_pos,
            ),
        ] {
            files.extend(write_figure(&plots, &fig)?);
        }
    }
    Ok(files)
}

fn loss_of(r: &ContextEval) -> &[f64] {
    &r.loss_by_position
}

fn entropy_of(r: &ContextEval) -> &[f64] {
    &r.entropy_by_position
}
