//! The statistics of the ablation report: mean ± sample standard deviation, Student's t
//! quantile, paired differences with a two-sided t confidence interval, and the LR sensitivity
//! of Wortsman et al. (2023).
//!
//! The t quantile is computed here (regularised incomplete beta by Lentz's continued fraction,
//! inverted by bisection) rather than pulled from a statistics crate; the tests pin it to
//! tabulated values.

use serde::Serialize;

/// Mean and sample standard deviation (n − 1 denominator; 0 for n = 1) of `n` finite values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeanStd {
    pub mean: f64,
    pub std: f64,
    pub n: usize,
}

/// Mean ± std of the finite values in `xs`; `None` when there is none.
pub fn mean_std(xs: &[f64]) -> Option<MeanStd> {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n as f64;
    let std = if n > 1 {
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Some(MeanStd { mean, std, n })
}

/// Half-width of the two-sided `level` t interval of a mean, t_{(1+level)/2, n−1} · std/√n;
/// `None` for n < 2.
pub fn t_half_width(ms: &MeanStd, level: f64) -> Option<f64> {
    (ms.n >= 2).then(|| t_quantile((1.0 + level) / 2.0, (ms.n - 1) as f64) * ms.std / (ms.n as f64).sqrt())
}

/// The paired difference a − b over seeds, with a two-sided t confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PairedDiff {
    /// Mean of the per-seed differences.
    pub mean: f64,
    /// Sample standard deviation of the differences.
    pub std: f64,
    /// Number of pairs (seeds where both values exist and are finite).
    pub n: usize,
    /// Confidence level of the interval (0.95).
    pub level: f64,
    /// The interval mean ± t_{(1+level)/2, n−1} · std/√n; `None` for n < 2.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
}

/// Paired difference a_i − b_i over the pairs where both are finite (`None` entries are missing
/// runs), with a `level` (e.g. 0.95) two-sided t interval, df = n − 1.
pub fn paired_diff(a: &[Option<f64>], b: &[Option<f64>], level: f64) -> Option<PairedDiff> {
    let d: Vec<f64> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| match (x, y) {
            (Some(x), Some(y)) if x.is_finite() && y.is_finite() => Some(x - y),
            _ => None,
        })
        .collect();
    let ms = mean_std(&d)?;
    let (ci_low, ci_high) = match t_half_width(&ms, level) {
        Some(half) => (Some(ms.mean - half), Some(ms.mean + half)),
        None => (None, None),
    };
    Some(PairedDiff {
        mean: ms.mean,
        std: ms.std,
        n: ms.n,
        level,
        ci_low,
        ci_high,
    })
}

/// LR sensitivity (Wortsman et al. 2023, §3.1): the mean over the swept learning rates of
/// min(ℓ(η), ℓ₀) − ℓ*, where ℓ(η) is the final loss at learning rate η, ℓ₀ the loss at
/// initialisation and ℓ* = min_η ℓ(η) the best loss of the sweep. A non-finite loss (a run that
/// blew up) counts as ℓ₀. `None` when `losses` is empty.
pub fn lr_sensitivity(losses: &[f64], init_loss: f64) -> Option<f64> {
    if losses.is_empty() {
        return None;
    }
    let capped: Vec<f64> = losses
        .iter()
        .map(|&l| {
            if l.is_finite() {
                l.min(init_loss)
            } else {
                init_loss
            }
        })
        .collect();
    let best = capped.iter().copied().fold(f64::INFINITY, f64::min);
    Some(capped.iter().map(|l| l - best).sum::<f64>() / capped.len() as f64)
}

/// The `p` quantile of Student's t distribution with `df` degrees of freedom (df > 0, 0 < p < 1).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    assert!(df > 0.0 && p > 0.0 && p < 1.0, "t_quantile({p}, {df})");
    if p == 0.5 {
        return 0.0;
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    // Bracket, then bisect: the CDF is monotone, and 200 halvings reach double precision.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t_cdf(hi, df) < p {
        lo = hi;
        hi *= 2.0;
        if hi > 1e300 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Student's t CDF: F(t) = 1 − ½·I_{df/(df+t²)}(df/2, ½) for t ≥ 0.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    let x = df / (df + t * t);
    let tail = 0.5 * reg_inc_beta(0.5 * df, 0.5, x);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// The regularised incomplete beta function I_x(a, b).
fn reg_inc_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    // The continued fraction converges fast for x < (a+1)/(a+b+2); use the symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// Continued fraction for the incomplete beta (modified Lentz; Numerical Recipes §6.4).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..1000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-16 {
            break;
        }
    }
    h
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9; ~15 significant digits).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_factorials() {
        for (n, f) in [(1.0, 1.0f64), (2.0, 1.0), (5.0, 24.0), (10.0, 362_880.0)] {
            assert!((ln_gamma(n) - f.ln()).abs() < 1e-12, "ln Γ({n})");
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
    }

    #[test]
    fn t_cdf_is_symmetric() {
        for df in [1.0, 3.0, 17.5] {
            assert!((t_cdf(0.7, df) + t_cdf(-0.7, df) - 1.0).abs() < 1e-14);
        }
        // Cauchy (df = 1): F(1) = 3/4.
        assert!((t_cdf(1.0, 1.0) - 0.75).abs() < 1e-13);
    }
}
