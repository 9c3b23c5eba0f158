//! How beam search ranks finished hypotheses of different lengths.
//!
//! A hypothesis's log-probability falls with every token, so ranking by it alone favours short
//! outputs. Two normalisations are in common use, and both are here so that a study can tune
//! either on its validation set:
//!
//! - GNMT's (Wu et al. 2016, tensor2tensor's default): `logprob / ((5 + len) / 6)^α`;
//! - fairseq's `--lenpen p`: `logprob / len^p` (fairseq's default is p = 1, the mean
//!   log-probability per token).
//!
//! `len` counts the final EOS in both, as fairseq and GNMT count it. Beam search chooses which
//! hypotheses finish by raw log-probability alone (see [`crate::beam_search`]); the penalty
//! only ranks the finished ones. So one search serves every penalty: rank its finished
//! hypotheses ([`crate::beam_search_finished`]) with each in turn, and the result is what a
//! search with that penalty returns.

use std::fmt;
use std::str::FromStr;

/// A length normalisation and its strength.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthPenalty {
    /// GNMT's `logprob / ((5 + len) / 6)^α`; α = 0 ranks by raw log-probability.
    Gnmt(f64),
    /// fairseq's `logprob / len^p`; p = 0 ranks by raw log-probability.
    Fairseq(f64),
}

impl LengthPenalty {
    /// The length-penalised score of a finished hypothesis of `tokens` tokens plus EOS.
    pub fn score(&self, logprob: f64, tokens: usize) -> f64 {
        let len = (tokens + 1) as f64;
        match *self {
            LengthPenalty::Gnmt(alpha) => logprob / ((5.0 + len) / 6.0).powf(alpha),
            LengthPenalty::Fairseq(p) => logprob / len.powf(p),
        }
    }

    /// The strength (α or p).
    pub fn strength(&self) -> f64 {
        match *self {
            LengthPenalty::Gnmt(v) | LengthPenalty::Fairseq(v) => v,
        }
    }

    /// `Err` naming the problem when the strength is not a finite number ≥ 0.
    pub fn check(&self) -> Result<(), String> {
        let v = self.strength();
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(format!(
                "a length penalty must be a finite number ≥ 0, got {self}"
            ))
        }
    }
}

/// `gnmt:0.6` or `fairseq:1`: the form [`FromStr`] reads and reports and JSON files carry.
impl fmt::Display for LengthPenalty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LengthPenalty::Gnmt(a) => write!(f, "gnmt:{a}"),
            LengthPenalty::Fairseq(p) => write!(f, "fairseq:{p}"),
        }
    }
}

/// Reads `gnmt:α`, `fairseq:p`, or a bare number (GNMT's α, the form `--length-penalty` has
/// always taken).
impl FromStr for LengthPenalty {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (kind, value) = s.split_once(':').unwrap_or(("gnmt", s));
        let v: f64 = value.trim().parse().map_err(|_| {
            format!("'{s}' is not a length penalty: write gnmt:α (e.g. gnmt:0.6), fairseq:p (e.g. fairseq:1) or a number (GNMT's α)")
        })?;
        let penalty = match kind.trim() {
            "gnmt" => LengthPenalty::Gnmt(v),
            "fairseq" => LengthPenalty::Fairseq(v),
            other => {
                return Err(format!(
                    "'{other}' is not a length normalisation: use gnmt (GNMT's ((5 + len) / 6)^α) or fairseq (fairseq's len^p)"
                ))
            }
        };
        penalty.check()?;
        Ok(penalty)
    }
}

/// In a config, the [`fmt::Display`] form (`gnmt:0.6`, `fairseq:1`).
impl serde::Serialize for LengthPenalty {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// From a config: `gnmt:α`, `fairseq:p`, or a bare number (GNMT's α), as [`FromStr`] reads them.
impl<'de> serde::Deserialize<'de> for LengthPenalty {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = LengthPenalty;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a length penalty: gnmt:α (e.g. gnmt:0.6), fairseq:p (e.g. fairseq:1) or a number (GNMT's α)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<LengthPenalty, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<LengthPenalty, E> {
                let penalty = LengthPenalty::Gnmt(v);
                penalty.check().map_err(E::custom)?;
                Ok(penalty)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<LengthPenalty, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<LengthPenalty, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl schemars::JsonSchema for LengthPenalty {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LengthPenalty".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "GNMT's α as gnmt:α or a bare number (logprob / ((5 + len) / 6)^α), or fairseq's lenpen as fairseq:p (logprob / len^p); ≥ 0",
            "anyOf": [
                { "type": "number", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*((gnmt|fairseq)\\s*:\\s*)?[0-9.eE+]+\\s*$" }
            ]
        })
    }
}
