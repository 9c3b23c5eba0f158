//! `report.md`: one function per section, in the order they appear. Numbers are formatted here
//! and nowhere else (report.json keeps them unrounded).

use std::path::Path;

use super::cells::{Cell, Counts};
use super::runs::RunResult;
use super::stats::{MeanStd, PairedDiff};
use super::{Report, BASELINE};
use crate::layout::{lr_label, Axis};

/// The quality column: BLEU for translation runs that decode, else validation perplexity.
struct Quality {
    /// Key in `vs_none`.
    key: &'static str,
    name: &'static str,
    /// Decimals.
    prec: usize,
}

impl Quality {
    fn of(r: &Report) -> Self {
        if r.quality == "bleu" {
            Self {
                key: "bleu",
                name: "BLEU",
                prec: 2,
            }
        } else {
            Self {
                key: "ppl",
                name: "val ppl",
                prec: 3,
            }
        }
    }

    fn is_bleu(&self) -> bool {
        self.key == "bleu"
    }
}

pub(crate) fn markdown(r: &Report) -> String {
    let q = Quality::of(r);
    [
        title(r),
        what_was_run(r),
        comparison(r, &q),
        plots(r),
        results(r, &q),
        paired_differences(r, &q),
        lr_sensitivity(r),
        axis_effects(r),
        unfinished_runs(r),
        every_run(r, &q),
        regenerate(r),
    ]
    .concat()
}

fn title(r: &Report) -> String {
    let title = r.config.as_ref().and_then(|c| c.file_stem()).map_or_else(
        || r.out_dir.display().to_string(),
        |s| s.to_string_lossy().to_string(),
    );
    format!("# QK-norm ablation: {title}\n\n")
}

/// The opening paragraph (the grid, the machine, the time, how runs are paired), then each run's
/// command and the plan's notes.
fn what_was_run(r: &Report) -> String {
    let mut md = [
        grid_sentence(r),
        hardware_sentence(r),
        time_sentence(r),
        PAIRING.to_string(),
    ]
    .concat();
    md.push_str("\n\n");
    if let Some(cmd) = &r.base_command {
        // The base command ends with `--quiet --json`; the grid's keys go before them.
        let head = &cmd[..cmd.len().saturating_sub(2)];
        md.push_str(&format!(
            "Each run: `{}{} --set model.qk_norm=V --set train.seed=S --set train.lr=LR{} --run-dir {}/runs/{}V-lrLR-seedS --quiet --json`.\n",
            head.join(" "),
            r.axes
                .iter()
                .map(|a| format!(" --set {}={}", a.key, a.label(&r.axes).to_uppercase()))
                .collect::<String>(),
            r.threads.map_or(String::new(), |t| format!(" --set train.threads={t}")),
            r.out_dir.display(),
            r.axes
                .iter()
                .map(|a| format!("{0}-{1}_", a.label(&r.axes), a.label(&r.axes).to_uppercase()))
                .collect::<String>(),
        ));
    }
    for n in &r.notes {
        md.push_str(&format!("Note: {n}.\n"));
    }
    md.push('\n');
    md
}

/// What was trained: the config, the grid and how its runs ended.
fn grid_sentence(r: &Report) -> String {
    let mut p = String::new();
    match &r.config {
        Some(c) => p.push_str(&format!("Trained `{}`", c.display())),
        None => p.push_str("Trained the runs under `runs/`"),
    }
    if !r.overrides.is_empty() {
        p.push_str(&format!(" with `--set {}`", r.overrides.join(" --set ")));
    }
    let params = r
        .cells
        .iter()
        .find(|c| c.variant == BASELINE)
        .or(r.cells.first())
        .and_then(|c| c.params);
    p.push_str(&format!(
        " ({}{}{}) for every QK-norm variant ({}) × seed ({}) × peak learning rate ({}){}: {} runs — {} finished, {} diverged, {} failed",
        r.arch.as_deref().unwrap_or("unknown architecture"),
        params.map_or(String::new(), |n| format!(", {n} parameters")),
        r.steps.map_or(String::new(), |s| format!(", {s} steps")),
        r.variants.join(", "),
        r.seeds.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        r.lrs.iter().map(|&l| lr_label(l)).collect::<Vec<_>>().join(", "),
        r.axes
            .iter()
            .map(|a| format!(" × `{}` ({})", a.key, a.values.join(", ")))
            .collect::<String>(),
        r.counts.runs,
        r.counts.ok,
        r.counts.diverged,
        r.counts.failed,
    ));
    if r.counts.incomplete + r.counts.not_run > 0 {
        p.push_str(&format!(
            ", {} not finished yet",
            r.counts.incomplete + r.counts.not_run
        ));
    }
    p.push_str(". ");
    p
}

/// The machine, and how many runs shared it.
fn hardware_sentence(r: &Report) -> String {
    let Some(h) = &r.hardware else {
        return String::new();
    };
    let mut p = format!(
        "Hardware: {} ({} logical cores{}){}",
        h.cpu,
        h.logical_cores,
        units_phrase(r, h.vector_unit.as_deref()),
        h.products.as_ref().map_or(String::new(), |p| format!(", {p}"))
    );
    if let (Some(j), Some(t)) = (r.jobs, r.threads) {
        p.push_str(&format!(
            ", {j} run{} at a time with {t} thread{} each",
            if j == 1 { "" } else { "s" },
            if t == 1 { "" } else { "s" }
        ));
        if j > 1 {
            p.push_str(" (tokens/s are measured with the runs sharing the machine)");
        }
    }
    p.push_str(". ");
    p.push_str(REPRODUCIBILITY);
    p
}

/// The kernels that computed the runs, as each run's checkpoints record them (`fallback`, the
/// sweep's machine, for runs from before they did): one unit, or each unit with its runs.
fn units_phrase(r: &Report, fallback: Option<&str>) -> String {
    let mut by_unit: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for run in r.runs.iter().filter(|run| run.status != "not_run") {
        let units: Vec<&str> = match run.vector_units.is_empty() {
            true => fallback.into_iter().collect(),
            false => run.vector_units.iter().map(String::as_str).collect(),
        };
        for unit in units {
            by_unit.entry(unit).or_default().push(&run.name);
        }
    }
    if by_unit.is_empty() {
        return fallback.map_or(String::new(), |u| format!(", {u} kernels"));
    }
    if by_unit.len() == 1 {
        return by_unit
            .keys()
            .next()
            .map_or(String::new(), |u| format!(", {u} kernels"));
    }
    let most = by_unit.values().map(Vec::len).max().unwrap_or(0);
    let parts: Vec<String> = by_unit
        .iter()
        .map(|(unit, runs)| {
            let n = runs.len();
            let s = if n == 1 { "" } else { "s" };
            if n == most {
                format!("{unit} kernels for {n} run{s}")
            } else {
                let shown: Vec<&str> = runs.iter().take(6).copied().collect();
                let more = if n > 6 { ", …" } else { "" };
                format!("{unit} kernels for {n} run{s} ({}{more})", shown.join(", "))
            }
        })
        .collect();
    format!(
        "; the runs were computed on more than one vector unit: {} (a run resumed on another unit \
         counts under both; its numbers differ in the last digits from a run on one unit)",
        parts.join(", ")
    )
}

const REPRODUCIBILITY: &str =
    "Rerunning gives the same bits on this machine at any thread count. On a CPU with another vector \
     unit (AVX-512 vs AVX2) the matrix products sum in another order: the first steps differ in \
     their last digits, and training can amplify that, most in unstable runs \
     (`EMBER_CPU_VECTOR_UNIT=avx2` computes an AVX2 machine's numbers on an AVX-512 one). ";

/// Wall time of the sweep and training time summed over runs.
fn time_sentence(r: &Report) -> String {
    let mut p = String::new();
    if let Some(w) = r.wall_secs {
        p.push_str(&format!(
            "Wall time {} over {} invocation{}; ",
            fmt_duration(w),
            r.invocations,
            if r.invocations == 1 { "" } else { "s" }
        ));
    }
    p.push_str(&format!(
        "{} of training summed over runs. ",
        fmt_duration(r.train_secs)
    ));
    p
}

const PAIRING: &str =
    "For a given seed every variant starts from the same initial values of every parameter it shares \
     with the others and sees the same batches in the same order, so each variant is compared with \
     `none` seed by seed. Means ± sample standard deviations are over the seeds of finished runs \
     (n in parentheses); diverged runs are counted, not averaged.";

/// The seed's table: per variant and learning rate, quality and validation loss with their paired
/// differences to `none`, and the largest attention logit.
fn comparison(r: &Report, q: &Quality) -> String {
    let mut md = format!(
        "## QK-norm vs baseline\n\n\
         At the end of training, per variant and peak learning rate: mean ± std over seeds (n), and \
         the difference to `none` on the same seeds, mean [95% CI]. {q_name} {}; val loss is nats per \
         target token; max attn logit is the largest |pre-softmax attention logit| over all attention \
         modules and logged steps, the instability QK-norm bounds.\n\n\
         |{} variant | peak LR | {q_name} | Δ {q_name} vs none [95% CI] | val loss | Δ val loss vs none [95% CI] | max attn logit |\n\
         |{}---|---|---|---|---|---|---|\n",
        if q.is_bleu() {
            "on the validation set (higher is better)"
        } else {
            "is validation perplexity (lower is better)"
        },
        axis_heads(&r.axes),
        axis_rule(&r.axes),
        q_name = q.name
    );
    for c in &r.cells {
        let quality = if q.is_bleu() { &c.bleu } else { &c.ppl };
        let vs_none = |key: &str, prec: usize| fmt_vs_none(c, key, prec);
        md.push_str(&format!(
            "|{} {} | {} | {} | {} | {} | {} | {} |\n",
            level_cells(&c.levels),
            c.variant,
            lr_label(c.lr),
            fmt_ms(quality, q.prec),
            vs_none(q.key, q.prec),
            fmt_ms(&c.val_loss, 4),
            vs_none("val_loss", 4),
            fmt_ms(&c.max_attn_logit, 1),
        ));
    }
    md.push('\n');
    md
}

/// Final values per variant and learning rate, with the differences that matter most.
fn results(r: &Report, q: &Quality) -> String {
    let mut md = String::from("## All final values\n\n");
    md.push_str(&format!(
        "Final values per variant and peak learning rate, mean ± std (n seeds). Losses are per target \
         token in nats; the train loss is the training objective over the last logging window; max attn \
         logit is the largest |pre-softmax attention logit| over all attention modules and logged steps.\n\n\
         |{} variant | peak LR | finished | train loss | val loss | Δ val loss vs none [95% CI] | {q_name} | Δ {q_name} vs none [95% CI] | max attn logit | tokens/s |\n\
         |{}---|---|---|---|---|---|---|---|---|---|\n",
        axis_heads(&r.axes),
        axis_rule(&r.axes),
        q_name = q.name
    ));
    for c in &r.cells {
        let quality = if q.is_bleu() { &c.bleu } else { &c.ppl };
        md.push_str(&format!(
            "|{} {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            level_cells(&c.levels),
            c.variant,
            lr_label(c.lr),
            fmt_count(&c.counts),
            fmt_ms(&c.train_loss, 4),
            fmt_ms(&c.val_loss, 4),
            fmt_vs_none(c, "val_loss", 4),
            fmt_ms(quality, q.prec),
            fmt_vs_none(c, q.key, q.prec),
            fmt_ms(&c.max_attn_logit, 2),
            fmt_ms(&c.tokens_per_sec, 0),
        ));
    }
    md.push('\n');
    md
}

/// Every metric's paired difference to `none` (left out when nothing is paired).
fn paired_differences(r: &Report, q: &Quality) -> String {
    if r.cells.iter().all(|c| c.vs_none.is_empty()) {
        return String::new();
    }
    let mut md = format!(
        "## Paired differences vs `none`\n\n\
         Δ = variant − none on the same seed and learning rate: mean [95% CI] (n seeds with both runs \
         finished); two-sided t interval, df = n − 1. Lower is better for losses and {}; higher for {}.\n\n\
         |{} variant | peak LR | Δ train loss | Δ val loss | Δ {q_name} | Δ max attn logit | Δ final attn logit | Δ tokens/s |\n\
         |{}---|---|---|---|---|---|---|---|\n",
        if q.is_bleu() { "attention logits" } else { "perplexity" },
        if q.is_bleu() { "BLEU" } else { "tokens/s" },
        axis_heads(&r.axes),
        axis_rule(&r.axes),
        q_name = q.name
    );
    for c in r.cells.iter().filter(|c| c.variant != BASELINE) {
        md.push_str(&format!(
            "|{} {} | {} | {} | {} | {} | {} | {} | {} |\n",
            level_cells(&c.levels),
            c.variant,
            lr_label(c.lr),
            fmt_diff(c.vs_none.get("train_loss"), 4),
            fmt_diff(c.vs_none.get("val_loss"), 4),
            fmt_diff(c.vs_none.get(q.key), q.prec),
            fmt_diff(c.vs_none.get("max_attn_logit"), 2),
            fmt_diff(c.vs_none.get("final_attn_logit"), 2),
            fmt_diff(c.vs_none.get("tokens_per_sec"), 0),
        ));
    }
    md.push('\n');
    md
}

fn lr_sensitivity(r: &Report) -> String {
    let mut md = String::from("## LR sensitivity\n\n");
    if r.lr_sensitivity.is_empty() {
        md.push_str("Not computed: the sweep has a single learning rate.\n\n");
        return md;
    }
    md.push_str(&format!(
        "As Wortsman et al. (2023) define it: the mean over the {} swept learning rates of \
         min(ℓ(η), ℓ₀) − ℓ*, where ℓ(η) is the final validation loss at peak learning rate η, ℓ* the \
         best of them, and ℓ₀ the loss at initialisation — here {}. A diverged run counts as \
         min(its final loss, ℓ₀). Computed per seed (seeds with a finished or diverged run at every \
         learning rate), then mean ± std over seeds; lower means less sensitive.\n\n\
         |{} variant | LR sensitivity | Δ vs none [95% CI] | best peak LR (mean val loss) |\n\
         |{}---|---|---|---|\n",
        r.lrs.len(),
        r.init_loss_source,
        axis_heads(&r.axes),
        axis_rule(&r.axes),
    ));
    for s in &r.lr_sensitivity {
        md.push_str(&format!(
            "|{} {} | {} | {} | {} |\n",
            level_cells(&s.levels),
            s.variant,
            fmt_ms(&s.value, 4),
            if s.variant == BASELINE {
                "(baseline)".into()
            } else {
                fmt_diff(s.vs_none.as_ref(), 4)
            },
            match (s.best_lr, s.best_val_loss) {
                (Some(l), Some(v)) => format!("{} ({v:.4})", lr_label(l)),
                _ => "–".into(),
            }
        ));
    }
    md.push('\n');
    md
}

/// The QK-norm effect on LR sensitivity per level of each axis (left out without axes).
fn axis_effects(r: &Report) -> String {
    if r.axis_effects.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## QK-norm effect by axis\n\n\
         Which factor carries the stability effect: for each level of each axis, the LR sensitivity of \
         `none` and of the variant, and the paired difference variant − none with a 95% t interval. \
         Every setting at that level and every seed gives one pair, so the effect is pooled over the \
         other axes' levels (a main effect); the per-setting table above shows where it interacts. \
         The ratio is none ÷ variant of the mean sensitivities (how many times less sensitive).\n\n\
         | axis | level | variant | pairs (settings) | LR sensitivity, none | LR sensitivity, variant | Δ vs none [95% CI] | ratio |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for e in &r.axis_effects {
        let ratio = match (&e.none, &e.value) {
            (Some(n), Some(v)) if v.mean > 0.0 => format!("{:.1}×", n.mean / v.mean),
            _ => "–".into(),
        };
        md.push_str(&format!(
            "| `{}` | {} | {} | {} ({}) | {} | {} | {} | {} |\n",
            e.axis,
            e.level,
            e.variant,
            e.vs_none.as_ref().map_or(0, |d| d.n),
            e.settings,
            fmt_ms(&e.none, 4),
            fmt_ms(&e.value, 4),
            fmt_diff(e.vs_none.as_ref(), 4),
            ratio
        ));
    }
    md.push('\n');
    md
}

/// A table's leading header cells for the axes (` positions | decay_embeddings |`).
fn axis_heads(axes: &[Axis]) -> String {
    axes.iter().map(|a| format!(" {} |", a.label(axes))).collect()
}

fn axis_rule(axes: &[Axis]) -> String {
    "---|".repeat(axes.len())
}

/// A row's leading cells for its levels.
fn level_cells(levels: &[String]) -> String {
    levels.iter().map(|v| format!(" {v} |")).collect()
}

/// Runs that diverged, failed or have not finished, with why (left out when there are none).
fn unfinished_runs(r: &Report) -> String {
    let bad: Vec<&RunResult> = r.runs.iter().filter(|x| x.status != "ok").collect();
    if bad.is_empty() {
        return String::new();
    }
    let mut md = String::from("## Diverged, failed and unfinished runs\n\n");
    for x in bad {
        let what = match x.status.as_str() {
            "not_run" => "not run yet".to_string(),
            "running" => format!(
                "running{}",
                x.steps.map_or(String::new(), |s| format!(" (step {s} saved)"))
            ),
            "incomplete" => format!(
                "interrupted{} (re-running `ember ablate` resumes it)",
                x.steps.map_or(String::new(), |s| format!(" at step {s}"))
            ),
            s => s.to_string(),
        };
        md.push_str(&format!(
            "- `{}`: {what}{}\n",
            x.name,
            x.detail.as_ref().map_or(String::new(), |d| format!(" — {d}"))
        ));
        if let Some(tail) = &x.stderr_tail {
            md.push_str("\n  ```text\n");
            for l in tail.lines() {
                md.push_str(&format!("  {l}\n"));
            }
            md.push_str("  ```\n\n");
        }
    }
    md.push('\n');
    md
}

/// Every run's final numbers, folded away.
fn every_run(r: &Report, q: &Quality) -> String {
    let mut md = format!(
        "<details><summary>Every run ({})</summary>\n\n\
         | run | status | steps | train loss | val loss | {q_name} | max attn logit | tokens/s | train time |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        r.runs.len(),
        q_name = q.name
    );
    let opt = |v: Option<f64>, p: usize| {
        v.filter(|x| x.is_finite())
            .map_or("–".to_string(), |x| format!("{x:.p$}"))
    };
    for x in &r.runs {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x.name,
            x.status,
            match (x.steps, x.total_steps) {
                (Some(a), Some(b)) => format!("{a}/{b}"),
                _ => "–".into(),
            },
            opt(x.final_train_loss, 4),
            opt(x.val_loss, 4),
            opt(if q.is_bleu() { x.bleu } else { x.val_ppl }, q.prec),
            opt(x.max_attn_logit, 2),
            opt(x.tokens_per_sec, 0),
            x.train_secs.map_or("–".into(), fmt_duration),
        ));
    }
    md.push_str("\n</details>\n\n");
    md
}

/// The PNG of every plot (left out when there are none).
fn plots(r: &Report) -> String {
    if r.plots.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Plots\n\nEach also as SVG beside the PNG. Lines: mean over seeds; shading: min–max over seeds.\n\n",
    );
    let stem = |p: &str| {
        Path::new(p)
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().to_string())
    };
    let pngs = r.plots.iter().filter(|p| p.ends_with(".png"));
    if r.axes.is_empty() {
        for p in pngs {
            md.push_str(&format!("![{}]({p})\n\n", stem(p)));
        }
        return md;
    }
    // One set of figures per setting: the final-loss figures inline, the per-step ones linked.
    let (inline, linked): (Vec<&String>, Vec<&String>) =
        pngs.partition(|p| p.ends_with("val_loss_vs_lr.png") || p.ends_with("bleu_vs_lr.png"));
    for p in inline {
        md.push_str(&format!("![{}]({p})\n\n", stem(p)));
    }
    md.push_str("Per-step curves (training loss, max attention logit) of each setting and peak LR: ");
    md.push_str(
        &linked
            .iter()
            .map(|p| format!("[{}]({p})", stem(p)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    md.push_str(".\n\n");
    md
}

fn regenerate(r: &Report) -> String {
    format!(
        "Regenerate this report (and report.json, plots/) without training: `ember report {}`.\n",
        r.out_dir.display()
    )
}

/// `2.3456 ± 0.0123 (3)`.
fn fmt_ms(m: &Option<MeanStd>, prec: usize) -> String {
    match m {
        Some(m) => format!("{:.p$} ± {:.p$} ({})", m.mean, m.std, m.n, p = prec),
        None => "–".into(),
    }
}

/// `-0.0123 [-0.0456, +0.0210] (3)`.
fn fmt_diff(d: Option<&PairedDiff>, prec: usize) -> String {
    match d {
        Some(d) => match (d.ci_low, d.ci_high) {
            (Some(lo), Some(hi)) => format!("{:+.p$} [{:+.p$}, {:+.p$}] ({})", d.mean, lo, hi, d.n, p = prec),
            _ => format!("{:+.p$} [n/a] ({})", d.mean, d.n, p = prec),
        },
        None => "–".into(),
    }
}

/// A cell's paired difference to `none` in `key`, or `(baseline)` in `none`'s own row.
fn fmt_vs_none(c: &Cell, key: &str, prec: usize) -> String {
    if c.variant == BASELINE {
        "(baseline)".into()
    } else {
        fmt_diff(c.vs_none.get(key), prec)
    }
}

/// `42.0 s`, `3m 07s`, `1h 05m`.
fn fmt_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{}h {:02}m", s / 3600, s % 3600 / 60)
    }
}

/// `2/3, 1 div.`: finished of all, then the rest by how they ended.
fn fmt_count(c: &Counts) -> String {
    let mut s = format!("{}/{}", c.ok, c.runs);
    if c.diverged > 0 {
        s.push_str(&format!(", {} div.", c.diverged));
    }
    if c.failed > 0 {
        s.push_str(&format!(", {} failed", c.failed));
    }
    if c.incomplete + c.not_run > 0 {
        s.push_str(&format!(", {} pending", c.incomplete + c.not_run));
    }
    s
}
