//! The report's plots, each as PNG and SVG in `OUT/plots/`:
//! - `loss_lr<LR>`: training loss vs step per variant (mean over seeds, band min–max);
//! - `max_logit_lr<LR>`: max |attention logit| vs step per variant (log axis);
//! - `bleu_lr<LR>`: BLEU vs step per variant (translation runs whose evals carry BLEU);
//! - `val_loss_vs_lr`: final validation loss vs peak learning rate per variant (log axis);
//! - `bleu_vs_lr`: final validation BLEU vs peak learning rate per variant (translation sweeps
//!   over several learning rates).
//!
//! Text is drawn with DejaVu Sans 2.37 embedded from the `dejavu` crate (Bitstream Vera license),
//! so PNGs render the same on a machine without system fonts. PNGs are encoded with the `png` crate
//! from plotters' RGB buffer, so the output is byte-for-byte reproducible.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::runs::RunResult;
use crate::layout::{lr_label, PLOTS};

const FAMILY: &str = "sans-serif";
const SIZE: (u32, u32) = (960, 600);

pub(crate) fn register_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded plot font could not be loaded"))
    }
}

/// One variant's line: (x, mean, min, max) over seeds, plus individual markers (x, y, diverged).
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) color: RGBColor,
    pub(crate) points: Vec<(f64, f64, f64, f64)>,
    pub(crate) markers: Vec<(f64, f64, bool)>,
}

pub(crate) struct Figure {
    pub(crate) stem: String,
    pub(crate) title: String,
    pub(crate) x_label: String,
    pub(crate) y_label: String,
    pub(crate) x_log: bool,
    pub(crate) y_log: bool,
    /// The x-axis counts steps: integer ticks.
    pub(crate) x_steps: bool,
    pub(crate) series: Vec<Series>,
    /// Values above this are drawn at it (a diverged run's loss would flatten every other line).
    pub(crate) y_cap: Option<f64>,
}

/// Fixed colours per variant (colour-blind-safe Tableau hues), so every plot agrees.
pub(crate) fn color(variant: &str, i: usize) -> RGBColor {
    match variant {
        "none" => RGBColor(64, 64, 64),
        "rmsnorm" => RGBColor(31, 119, 180),
        "layernorm" => RGBColor(255, 127, 14),
        "l2" => RGBColor(44, 160, 44),
        _ => [
            RGBColor(214, 39, 40),
            RGBColor(148, 103, 189),
            RGBColor(140, 86, 75),
        ][i % 3],
    }
}

/// Mean, min and max over seeds at each step where any seed has a value.
fn aggregate<'a>(curves: impl Iterator<Item = &'a Vec<(u64, f64)>>) -> Vec<(f64, f64, f64, f64)> {
    let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for c in curves {
        for &(s, v) in c {
            if v.is_finite() {
                by_step.entry(s).or_default().push(v);
            }
        }
    }
    by_step
        .into_iter()
        .filter_map(|(s, v)| band(&v).map(|(mean, lo, hi)| (s as f64, mean, lo, hi)))
        .collect()
}

/// Writes every plot; returns their paths relative to `out_dir` (PNG, then SVG, per plot).
/// The runs of one setting of a sweep with factorial axes (or all runs, without axes), and how
/// its figures are named: `<label>_<stem>` files, `(<title>)` after their titles.
pub(crate) struct PlotGroup<'a> {
    pub label: String,
    pub title: String,
    pub runs: Vec<&'a RunResult>,
}

/// Draws every group's figures into `OUT/plots/`; returns their paths relative to `out_dir`.
pub(crate) fn write_plots(
    out_dir: &Path,
    variants: &[String],
    lrs: &[f64],
    groups: &[PlotGroup],
    quality: &str,
) -> Result<Vec<String>> {
    register_font()?;
    let dir = out_dir.join(PLOTS);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = vec![];
    for group in groups {
        for mut fig in figures(variants, lrs, &group.runs, quality) {
            if !group.label.is_empty() {
                fig.stem = format!("{}_{}", group.label, fig.stem);
                fig.title = format!("{} ({})", fig.title, group.title);
            }
            files.extend(write_figure(&dir, &fig)?);
        }
    }
    Ok(files)
}

/// The figures of one group of runs: per-step curves at each peak learning rate, and final
/// validation loss against it.
fn figures(variants: &[String], lrs: &[f64], runs: &[&RunResult], quality: &str) -> Vec<Figure> {
    let mut figures = vec![];
    for &lr in lrs {
        let at_lr: Vec<&RunResult> = runs
            .iter()
            .copied()
            .filter(|r| lr_label(r.lr) == lr_label(lr))
            .collect();
        figures.extend(curves_at(lr, variants, &at_lr, quality));
    }
    let legend = Legend::new(variants, runs);
    figures.extend(val_loss_vs_lr(variants, lrs, runs, &legend));
    if quality == "bleu" && lrs.len() > 1 {
        figures.extend(bleu_vs_lr(variants, lrs, runs, &legend));
    }
    figures
}

/// What a figure's lines average over. Every variant over the same number of seeds at every
/// rate: that number, in the title. Otherwise (a sweep still running, a run that failed) each
/// variant's own count beside its name — a range when it differs between rates — so that a point
/// drawn from one seed does not pass for a mean of three.
struct Legend {
    band: String,
    /// Fewest and most seeds per rate, per variant, kept only when the counts differ.
    uneven_seeds: BTreeMap<String, (usize, usize)>,
}

impl Legend {
    /// Seeds are counted per rate over the runs that logged a training curve.
    fn new(variants: &[String], runs: &[&RunResult]) -> Self {
        let seed_range = |v: &str| {
            let mut per_lr: BTreeMap<String, std::collections::BTreeSet<u64>> = BTreeMap::new();
            for r in runs
                .iter()
                .filter(|r| r.variant == v && !r.curves.train_loss.is_empty())
            {
                per_lr.entry(lr_label(r.lr)).or_default().insert(r.seed);
            }
            let counts = per_lr.values().map(|s| s.len());
            Some((counts.clone().min()?, counts.max()?))
        };
        let mut ranges: BTreeMap<String, (usize, usize)> = variants
            .iter()
            .filter_map(|v| Some((v.clone(), seed_range(v)?)))
            .collect();
        let first = ranges.values().next().copied();
        if ranges
            .values()
            .all(|&(lo, hi)| lo == hi && Some((lo, hi)) == first)
        {
            ranges.clear();
        }
        let band = match first {
            Some((n, _)) if ranges.is_empty() => format!("mean over {}, shaded min–max", seeds_phrase(n, n)),
            _ => "mean over each variant's seeds, shaded min–max".to_string(),
        };
        Legend {
            band,
            uneven_seeds: ranges,
        }
    }

    fn name(&self, variant: &str) -> String {
        match self.uneven_seeds.get(variant) {
            Some(&(lo, hi)) => format!("{variant} ({})", seeds_phrase(lo, hi)),
            None => variant.to_string(),
        }
    }
}

fn seeds_phrase(lo: usize, hi: usize) -> String {
    match (lo, hi) {
        (1, 1) => "1 seed".to_string(),
        (n, m) if n == m => format!("{n} seeds"),
        (n, m) => format!("{n}–{m} seeds"),
    }
}

/// The per-step figures of one peak learning rate: training loss, max attention logit and (for
/// translation runs that decode) BLEU, one line per variant; `runs` are that rate's.
fn curves_at(lr: f64, variants: &[String], runs: &[&RunResult], quality: &str) -> Vec<Figure> {
    let legend = Legend::new(variants, runs);
    let band = &legend.band;
    let cell = |v: &str| -> Vec<&RunResult> { runs.iter().copied().filter(|r| r.variant == v).collect() };
    let series_of = |f: &dyn Fn(&RunResult) -> &Vec<(u64, f64)>| -> Vec<Series> {
        variants
            .iter()
            .enumerate()
            .map(|(i, v)| Series {
                label: legend.name(v),
                color: color(v, i),
                points: aggregate(cell(v).into_iter().map(f)),
                markers: vec![],
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let mut figures = vec![];
    // The first logged loss of any run is about the loss at initialisation; a diverging
    // run's values above 1.1× that are drawn at the cap.
    let init = runs
        .iter()
        .filter_map(|r| r.curves.train_loss.first().map(|p| p.1))
        .fold(f64::NAN, f64::max);
    let loss = series_of(&|r| &r.curves.train_loss);
    if !loss.is_empty() {
        figures.push(Figure {
            stem: format!("loss_lr{}", lr_label(lr)),
            title: format!("Training loss, peak LR {} ({band})", lr_label(lr)),
            x_label: "step (optimizer updates)".into(),
            y_label: "training loss (nats/token)".into(),
            x_log: false,
            y_log: false,
            x_steps: true,
            series: loss,
            y_cap: init.is_finite().then_some(init * 1.1),
        });
    }
    let logit = series_of(&|r| &r.curves.max_logit);
    if !logit.is_empty() {
        figures.push(Figure {
            stem: format!("max_logit_lr{}", lr_label(lr)),
            title: format!("Max attention logit, peak LR {} ({band})", lr_label(lr)),
            x_label: "step (optimizer updates)".into(),
            y_label: "max |pre-softmax attention logit| (log scale)".into(),
            x_log: false,
            y_log: true,
            x_steps: true,
            series: logit,
            y_cap: None,
        });
    }
    if quality == "bleu" {
        let bleu = series_of(&|r| &r.curves.bleu);
        if !bleu.is_empty() {
            figures.push(Figure {
                stem: format!("bleu_lr{}", lr_label(lr)),
                title: format!("Validation BLEU, peak LR {} ({band})", lr_label(lr)),
                x_label: "step (optimizer updates)".into(),
                y_label: "BLEU (sacreBLEU, 0–100)".into(),
                x_log: false,
                y_log: false,
                x_steps: true,
                series: bleu,
                y_cap: None,
            });
        }
    }
    figures
}

/// Final validation loss vs peak learning rate, one line per variant (none when no run ended):
/// per seed min(loss, loss at init), so that a diverged run (marked ×) sits at the loss at init.
fn val_loss_vs_lr(variants: &[String], lrs: &[f64], runs: &[&RunResult], legend: &Legend) -> Option<Figure> {
    let capped_loss = |r: &RunResult| {
        let init = r.init_val_loss.or_else(|| r.vocab_size.map(|n| (n as f64).ln()));
        match (r.val_loss.filter(|l| l.is_finite()), init) {
            (Some(l), Some(i)) => Some(l.min(i)),
            (Some(l), None) => Some(l),
            (None, init) => init,
        }
    };
    final_vs_lr(
        "val_loss_vs_lr",
        format!("Final validation loss vs peak LR ({})", legend.band),
        "final validation loss, capped at the loss at init (nats/token)",
        (variants, lrs, runs, legend),
        &capped_loss,
    )
}

/// Final validation BLEU vs peak learning rate, one line per variant (none when no run ended):
/// per seed the BLEU of the last evaluation; a diverged run (marked ×) counts what it last
/// scored, 0 if it never decoded.
fn bleu_vs_lr(variants: &[String], lrs: &[f64], runs: &[&RunResult], legend: &Legend) -> Option<Figure> {
    let bleu = |r: &RunResult| match r.status.as_str() {
        "diverged" => Some(r.bleu.unwrap_or(0.0)),
        _ => r.bleu,
    };
    final_vs_lr(
        "bleu_vs_lr",
        format!("Final validation BLEU vs peak LR ({})", legend.band),
        "final validation BLEU (sacreBLEU, 0–100)",
        (variants, lrs, runs, legend),
        &bleu,
    )
}

/// A final value (`value` of each finished or diverged run; `None` leaves a run out) against the
/// peak learning rate on a log axis: per variant the mean over seeds, shaded min–max, each seed a
/// marker (× where it diverged).
fn final_vs_lr(
    stem: &str,
    title: String,
    y_label: &str,
    (variants, lrs, runs, legend): (&[String], &[f64], &[&RunResult], &Legend),
    value: &dyn Fn(&RunResult) -> Option<f64>,
) -> Option<Figure> {
    let mut series = vec![];
    for (i, v) in variants.iter().enumerate() {
        let mut points = vec![];
        let mut markers = vec![];
        for &lr in lrs {
            let mut vals = vec![];
            for r in runs
                .iter()
                .filter(|r| r.variant == *v && lr_label(r.lr) == lr_label(lr))
                .filter(|r| r.status == "ok" || r.status == "diverged")
            {
                if let Some(y) = value(r) {
                    vals.push(y);
                    markers.push((lr, y, r.status == "diverged"));
                }
            }
            if let Some((mean, lo, hi)) = band(&vals) {
                points.push((lr, mean, lo, hi));
            }
        }
        if !points.is_empty() {
            series.push(Series {
                label: legend.name(v),
                color: color(v, i),
                points,
                markers,
            });
        }
    }
    (!series.is_empty()).then(|| Figure {
        stem: stem.into(),
        title,
        x_label: "peak learning rate (log scale)".into(),
        y_label: y_label.into(),
        x_log: true,
        y_log: false,
        x_steps: false,
        series,
        y_cap: None,
    })
}

/// (mean, min, max) of `xs`, the line and shaded band of a series; `None` when empty.
pub(crate) fn band(xs: &[f64]) -> Option<(f64, f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((mean, lo, hi))
}

/// Draws `fig` as `DIR/<stem>.png` and `.svg`; returns their paths relative to the output directory.
pub(crate) fn write_figure(dir: &Path, fig: &Figure) -> Result<[String; 2]> {
    let png_path = dir.join(format!("{}.png", fig.stem));
    let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
        render(root, fig).with_context(|| format!("drawing {}", png_path.display()))?;
    }
    write_png(&png_path, &buf, SIZE)?;
    let svg_path = dir.join(format!("{}.svg", fig.stem));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        render(root, fig).with_context(|| format!("drawing {}", svg_path.display()))?;
    }
    ember_data::io::write_atomic(&svg_path, svg.as_bytes())
        .with_context(|| format!("writing {}", svg_path.display()))?;
    Ok([
        format!("{PLOTS}/{}.png", fig.stem),
        format!("{PLOTS}/{}.svg", fig.stem),
    ])
}

fn write_png(path: &Path, rgb: &[u8], (w, h): (u32, u32)) -> Result<()> {
    let mut png_bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut png_bytes, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::High);
    let mut writer = enc
        .write_header()
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .write_image_data(rgb)
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .finish()
        .with_context(|| format!("writing {}", path.display()))?;
    ember_data::io::write_atomic(path, &png_bytes).with_context(|| format!("writing {}", path.display()))
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

/// Axis ranges from the data, padded; log axes stay positive.
fn ranges(fig: &Figure) -> ((f64, f64), (f64, f64)) {
    let mut xs = vec![];
    let mut ys = vec![];
    for s in &fig.series {
        for p in &s.points {
            xs.push(p.0);
            ys.extend([p.2, p.3]);
        }
        for m in &s.markers {
            ys.push(m.1);
        }
    }
    let keep = |v: &f64, log: bool| v.is_finite() && (!log || *v > 0.0);
    let xs: Vec<f64> = xs.into_iter().filter(|v| keep(v, fig.x_log)).collect();
    let ys: Vec<f64> = ys
        .into_iter()
        .map(|v| fig.y_cap.map_or(v, |c| v.min(c)))
        .filter(|v| keep(v, fig.y_log))
        .collect();
    let span = |v: &[f64], log: bool| -> (f64, f64) {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !lo.is_finite() {
            return if log { (0.1, 10.0) } else { (0.0, 1.0) };
        }
        if log {
            let (lo, hi) = if hi / lo < 1.5 {
                (lo / 1.5, hi * 1.5)
            } else {
                (lo, hi)
            };
            (lo / 1.15, hi * 1.15)
        } else {
            let pad = if hi > lo {
                0.05 * (hi - lo)
            } else {
                0.5 * lo.abs().max(1.0)
            };
            (lo - pad, hi + pad)
        }
    };
    let x = span(&xs, fig.x_log);
    // Steps start at the first logged step: keep a step axis tight on the data; give a log axis
    // room for the markers at its ends.
    let x = if fig.x_log {
        (x.0 / 1.4, x.1 * 1.4)
    } else {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() && hi > lo {
            (lo, hi)
        } else {
            x
        }
    };
    (x, span(&ys, fig.y_log))
}

fn render<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, fig: &Figure) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let body = root
        .margin(10, 0, 0, 0)
        .titled(&fig.title, (FAMILY, 20))
        .map_err(err)?;
    let (plot, legend) = body.split_horizontally(SIZE.0 as i32 - LEGEND_WIDTH);
    let ((x0, x1), (y0, y1)) = ranges(fig);
    let r = ((x0, x1), (y0, y1));
    // A log x axis is the swept learning rates: labelled at each of them, since a sweep within
    // one decade (2.5e-3 … 2e-2) would otherwise show a single decade label or none.
    let mut swept: Vec<f64> = fig
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    swept.sort_by(f64::total_cmp);
    swept.dedup();
    let log_x = || (x0..x1).log_scale().with_key_points(swept.clone());
    match (fig.x_log, fig.y_log) {
        (false, false) => draw(&plot, fig, x0..x1, y0..y1, r)?,
        (true, false) => draw(&plot, fig, log_x(), y0..y1, r)?,
        (false, true) => draw(&plot, fig, x0..x1, (y0..y1).log_scale(), r)?,
        (true, true) => draw(&plot, fig, log_x(), (y0..y1).log_scale(), r)?,
    }
    draw_legend(&legend, fig)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Width of the legend panel right of the plot, so the legend never covers data.
const LEGEND_WIDTH: i32 = 190;

fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let text = (FAMILY, 15).into_font().color(&BLACK);
    let note = (FAMILY, 13).into_font().color(&RGBColor(90, 90, 90));
    let mut y = 40;
    for s in &fig.series {
        area.draw(&PathElement::new(vec![(8, y), (36, y)], s.color.stroke_width(3)))
            .map_err(err)?;
        area.draw(&Text::new(s.label.clone(), (44, y - 9), text.clone()))
            .map_err(err)?;
        y += 26;
    }
    y += 8;
    let gray = RGBColor(120, 120, 120);
    if fig.series.iter().any(|s| s.points.len() > 1) {
        area.draw(&Rectangle::new(
            [(8, y - 7), (36, y + 7)],
            gray.mix(0.25).filled(),
        ))
        .map_err(err)?;
        area.draw(&Text::new("min–max over seeds", (44, y - 8), note.clone()))
            .map_err(err)?;
        y += 24;
    }
    if fig.series.iter().any(|s| s.markers.iter().any(|m| !m.2)) {
        area.draw(&Circle::new((22, y), 3, gray.filled())).map_err(err)?;
        area.draw(&Text::new("one seed", (44, y - 8), note.clone()))
            .map_err(err)?;
        y += 24;
    }
    if fig.series.iter().any(|s| s.markers.iter().any(|m| m.2)) {
        area.draw(&Cross::new((22, y), 6, gray.stroke_width(2)))
            .map_err(err)?;
        area.draw(&Text::new("one seed, diverged", (44, y - 8), note.clone()))
            .map_err(err)?;
        y += 24;
    }
    if let Some(cap) = clipped(fig) {
        area.draw(&Text::new(
            format!("↑ values above {}", tick(cap)),
            (8, y - 8),
            note.clone(),
        ))
        .map_err(err)?;
        area.draw(&Text::new("drawn at the top edge", (22, y + 8), note))
            .map_err(err)?;
    }
    Ok(())
}

/// The cap, when some value lies above it.
fn clipped(fig: &Figure) -> Option<f64> {
    let cap = fig.y_cap?;
    fig.series
        .iter()
        .any(|s| s.points.iter().any(|p| p.3 > cap) || s.markers.iter().any(|m| m.1 > cap))
        .then_some(cap)
}

/// Tick labels: plain decimals, or `1e-3` for very small or large magnitudes.
fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() < 1e-2 || v.abs() >= 1e4 {
        let s = format!("{:.2e}", v);
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = m.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e{e}");
    }
    let s = format!("{v:.4}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn draw<DB, X, Y>(
    root: &DrawingArea<DB, Shift>,
    fig: &Figure,
    x: X,
    y: Y,
    ((x0, x1), (y0, y1)): ((f64, f64), (f64, f64)),
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .margin(16)
        .x_label_area_size(52)
        .y_label_area_size(76)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    let fmt = |v: &f64| tick(*v);
    // Learning rates read best as 1e-3, 1e-2, ...
    let sci = |v: &f64| lr_label(*v);
    let x_fmt: &dyn Fn(&f64) -> String = if fig.x_log { &sci } else { &fmt };
    let mut mesh = chart.configure_mesh();
    if fig.x_steps {
        // At most one tick per step.
        mesh.x_labels(((x1 - x0).round() as usize + 1).clamp(2, 10));
    }
    // Log axes: a few labelled decades, not every minor tick.
    if fig.x_log {
        mesh.x_labels(8);
    }
    if fig.y_log {
        mesh.y_labels(8);
    }
    mesh.x_desc(fig.x_label.as_str())
        .y_desc(fig.y_label.as_str())
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .x_label_formatter(x_fmt)
        .y_label_formatter(&fmt)
        .light_line_style(RGBColor(244, 244, 244))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err)?;
    // Clamp to the plotted range: plotters does not clip elements to the plotting area.
    let clamp = |v: f64| v.max(y0).min(y1);
    for s in &fig.series {
        let cap = |v: f64| clamp(fig.y_cap.map_or(v, |c| v.min(c)));
        if s.points.len() > 1 {
            let mut band: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0, cap(p.2))).collect();
            band.extend(s.points.iter().rev().map(|p| (p.0, cap(p.3))));
            chart
                .draw_series(std::iter::once(Polygon::new(band, s.color.mix(0.18).filled())))
                .map_err(err)?;
        }
        let color = s.color;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|p| (p.0, cap(p.1))),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        if s.points.len() == 1 {
            let p = s.points[0];
            chart
                .draw_series(std::iter::once(Circle::new((p.0, cap(p.1)), 4, color.filled())))
                .map_err(err)?;
        }
        chart
            .draw_series(
                s.markers
                    .iter()
                    .filter(|m| !m.2)
                    .map(|m| Circle::new((m.0, cap(m.1)), 3, color.filled())),
            )
            .map_err(err)?;
        chart
            .draw_series(
                s.markers
                    .iter()
                    .filter(|m| m.2)
                    .map(|m| Cross::new((m.0, cap(m.1)), 6, color.stroke_width(2))),
            )
            .map_err(err)?;
    }
    Ok(())
}
