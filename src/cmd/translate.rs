//! `ember translate`: translates source lines from stdin to stdout with a trained seq2seq run,
//! one output line per input line (a line that cannot be translated is left blank and named).

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use clap::Args;
use ember_model::Model;
use ember_trainer::tell;
use ember_trainer::translate::translate_source_lines;

use super::decode::DecodeArgs;

#[derive(Args)]
pub(crate) struct TranslateArgs {
    #[command(flatten)]
    decode: DecodeArgs,
    /// One JSON object per line (text, score, tokens) instead of plain text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: TranslateArgs) -> Result<()> {
    let run = args.decode.open_model()?;
    let Model::Seq2seq(m) = &run.model else {
        bail!(
            "{} is a language model; use `ember generate`",
            args.decode.run.display()
        );
    };
    if args.decode.length_penalty.len() > 1 {
        bail!(
            "translate takes one --length-penalty, got {}; to compare several, score them on the \
             validation split with `ember eval RUN --split valid --length-penalty A,B,...`",
            args.decode.length_penalty.len()
        );
    }
    let beam = args.decode.beam_config(&run.cfg);
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading source lines from stdin")?;
    // Line by line, so that one line that is not UTF-8 costs that line only.
    let lines: Vec<Result<String, String>> = split_byte_lines(&bytes)
        .into_iter()
        .map(|l| {
            String::from_utf8(l.to_vec()).map_err(|e| {
                format!(
                    "not valid UTF-8 (byte {} of the line); re-encode the input as UTF-8",
                    e.utf8_error().valid_up_to() + 1
                )
            })
        })
        .collect();
    let out = translate_source_lines(
        m,
        &run.tokenizer,
        &lines,
        run.cfg.model.max_seq_len,
        &beam,
        &run.device,
    )?;
    let mut stdout = std::io::stdout().lock();
    let mut failed = vec![];
    let mut reasons: Vec<(&str, usize)> = vec![];
    for (i, t) in out.iter().enumerate() {
        match t {
            Ok(t) if args.json => writeln!(stdout, "{}", serde_json::to_string(t)?)?,
            Ok(t) => writeln!(stdout, "{}", t.text)?,
            Err(reason) => {
                tell!("stdin:{}: {reason}; its output line is left blank", i + 1);
                failed.push(i + 1);
                let kind = reason_kind(reason);
                match reasons.iter_mut().find(|(k, _)| *k == kind) {
                    Some((_, n)) => *n += 1,
                    None => reasons.push((kind, 1)),
                }
                if args.json {
                    let line = serde_json::json!({"line": i + 1, "error": reason});
                    writeln!(stdout, "{line}")?;
                } else {
                    writeln!(stdout)?;
                }
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} lines could not be translated (line{} {}): {}; their output lines are blank \
             and every other line was translated",
            failed.len(),
            out.len(),
            if failed.len() == 1 { "" } else { "s" },
            failed
                .iter()
                .take(20)
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            reasons
                .iter()
                .map(|(kind, n)| format!("{n} {kind}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Why a line failed, as the closing summary counts it ("not valid UTF-8 (re-encode …)").
fn reason_kind(reason: &str) -> &'static str {
    if reason.starts_with("not valid UTF-8") {
        "not valid UTF-8 (re-encode the input as UTF-8, e.g. `iconv -f LATIN1 -t UTF-8`)"
    } else if reason.contains("max_seq_len") {
        "longer than the model's max_seq_len (split them into shorter sentences)"
    } else {
        "refused for the reason given above"
    }
}

/// Lines of raw input as `split_lines` cuts text: on '\n', a trailing newline ends the last
/// line rather than starting an empty one, and a '\r' before the '\n' is dropped.
fn split_byte_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.is_empty() {
        return vec![];
    }
    body.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect()
}
