//! The length study's figures: loss vs context per variant, and loss and attention entropy by
//! position at the longest context, each for log-n off and on; mean over seeds, shaded min–max.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use ember_trainer::context::ContextEval;

use super::evals::Eval;
use crate::layout::PLOTS;
use crate::report::plots::{band, color, register_font, write_figure, Figure, Series};

/// Writes every figure into `dir/plots/` and returns their paths relative to `dir`.
pub(super) fn write_length_plots(
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
        let [vs_context, loss_pos, entropy_pos] = arm_series(variants, contexts, evals, longest, logn);
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

/// The series of one log-n arm, a line per variant: loss vs context, then loss and attention
/// entropy by position at the longest context.
fn arm_series(
    variants: &[String],
    contexts: &[usize],
    evals: &[Eval],
    longest: usize,
    logn: bool,
) -> [Vec<Series>; 3] {
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
    [vs_context, loss_pos, entropy_pos]
}

fn loss_of(r: &ContextEval) -> &[f64] {
    &r.loss_by_position
}

fn entropy_of(r: &ContextEval) -> &[f64] {
    &r.entropy_by_position
}
