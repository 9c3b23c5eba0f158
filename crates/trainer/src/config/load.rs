//! Loading a run config: YAML text → generic tree → `--set` overrides → typed config →
//! validation, where every failure names the file, the key path and (where the key came from
//! the file) its line, in words that say what to do.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::RunConfig;

/// A configuration that cannot be used, with everything needed to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}{}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default(), key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default())]
pub struct ConfigFileError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: Option<String>,
    pub message: String,
}

impl RunConfig {
    /// Reads `path`, applies `--set KEY=VALUE` overrides, and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigFileError> {
        Self::from_yaml(&read_text(path)?, path, overrides)
    }

    /// As [`load`](Self::load), from YAML text; `path` only labels errors.
    pub fn from_yaml(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigFileError> {
        let err = error_in(path);
        let mut tree = Self::yaml_tree(text, path, overrides)?;
        let overridden: Vec<&str> = overrides
            .iter()
            .filter_map(|o| o.split_once('='))
            .map(|(k, _)| k)
            .collect();
        if let Some((key, message)) = misshapen_section(&tree) {
            let line = locate(text, &key);
            return Err(err(line, (key != ".").then_some(key), message));
        }
        crate::setup::init_from::complete(&mut tree)
            .map_err(|(key, message)| err(locate(text, &key), Some(key), message))?;
        let cfg: RunConfig = serde_path_to_error::deserialize(&tree).map_err(|e| {
            let mut key = e.path().to_string();
            let mut message = e.into_inner().to_string();
            if key == "data.corpus" {
                // The corpus is an internally tagged enum, where serde loses the field's path;
                // deserialising the chosen variant on its own recovers it.
                if let Some((field, m)) = corpus_error(&tree["data"]["corpus"]) {
                    key = format!("data.corpus.{field}");
                    message = m;
                }
            }
            let from_set = overridden
                .iter()
                .any(|k| key.starts_with(k) || k.starts_with(key.as_str()));
            let key = (key != ".").then_some(key);
            let line = if from_set {
                None
            } else {
                key.as_deref().and_then(|k| locate(text, k))
            };
            err(line, key, clip(&message))
        })?;
        cfg.validate().map_err(|(key, message)| {
            let message = if overrides.is_empty() {
                message
            } else {
                format!("{message} (with --set {})", clip(&overrides.join(" --set ")))
            };
            err(locate(text, &key), Some(key), message)
        })?;
        Ok(cfg)
    }

    /// The config's YAML as a tree with the `--set` overrides applied: what the schema
    /// (`ember config schema`) describes, before the model folder of `model.init_from` fills
    /// anything in and before any type or range is checked. Fails only on YAML that does not
    /// parse, an empty file and a malformed override.
    pub fn yaml_tree(text: &str, path: &Path, overrides: &[String]) -> Result<Value, ConfigFileError> {
        let err = error_in(path);
        if text.len() > MAX_CONFIG_BYTES {
            return Err(err(
                None,
                None,
                format!(
                    "the file has more than {MAX_CONFIG_BYTES} bytes; a config is a few kilobytes, \
                     so this is probably not the config you meant"
                ),
            ));
        }
        let mut tree: Value = serde_saphyr::from_str(text).map_err(|e| {
            let message = first_line(&e.to_string()).to_string();
            let line = yaml_error_line(&message);
            // A value the parser refuses (`.inf`) is named by its key; a structural error is not
            // at a key.
            let key = line
                .filter(|_| message.contains("non-finite"))
                .and_then(|l| key_at(text, l, yaml_error_column(&message)));
            err(line, key.clone(), yaml_message(&message, key.as_deref()))
        })?;
        if tree.is_null() {
            return Err(err(
                None,
                None,
                "the file is empty; see configs/quickstart.yaml for a complete example".into(),
            ));
        }
        for o in overrides {
            let (key, value) = o.split_once('=').ok_or_else(|| {
                err(
                    None,
                    None,
                    format!("--set {o:?}: expected KEY=VALUE, e.g. --set train.lr=3e-3"),
                )
            })?;
            let value: Value = serde_saphyr::from_str(value).map_err(|e| {
                let said = yaml_message(first_line(&e.to_string()), Some(key));
                err(
                    None,
                    Some(key.into()),
                    format!(
                        "--set {key}={}: {}",
                        clip(value),
                        said.strip_prefix("not valid YAML: ").unwrap_or(&said)
                    ),
                )
            })?;
            set_path(&mut tree, key, value)
                .map_err(|m| err(None, Some(key.into()), format!("--set: {m}")))?;
        }
        Ok(tree)
    }
}

/// The text of a config file. At most one byte past the limit is read, so that `/dev/zero` or a
/// 10 GB file given by mistake is refused by the size check instead of filling the memory.
pub(super) fn read_text(path: &Path) -> Result<String, ConfigFileError> {
    use std::io::Read;
    let err = |message: String| error_in(path)(None, None, message);
    let mut text = String::new();
    ember_data::io::open_input(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES as u64 + 1).read_to_string(&mut text))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                err("cannot read the config: it is not UTF-8 text (is it the YAML file?)".into())
            }
            _ => err(format!("cannot read the config: {e}")),
        })?;
    Ok(text)
}

/// The error maker of one file: `(line, key, message)` to a [`ConfigFileError`].
fn error_in(path: &Path) -> impl Fn(Option<usize>, Option<String>, String) -> ConfigFileError + '_ {
    |line, key, message| ConfigFileError {
        file: path.to_path_buf(),
        line,
        key,
        message,
    }
}

/// Configs larger than this are refused before parsing: a real one is a few kilobytes.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// A serde-saphyr error in the user's words: what is wrong and what to do. `key` is the
/// dotted key the error is at, when known.
fn yaml_message(message: &str, key: Option<&str>) -> String {
    let detail = message
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("error"))
        .map_or(message, |(_, rest)| rest);
    // Past "line L column C: ", the parser's own words.
    let what = detail
        .find(": ")
        .filter(|_| detail.starts_with("line "))
        .map_or(detail, |i| &detail[i + 2..]);
    let at = detail.strip_suffix(what).unwrap_or("").trim_end_matches(": ");
    let said = if let Some(rest) = what.strip_prefix("duplicate mapping key: ") {
        let key = rest.split(", set DuplicateKeyPolicy").next().unwrap_or(rest);
        format!(
            "the key `{}` is given twice in the same section ({at}); keep one of them",
            clip(key)
        )
    } else if what.starts_with("budget breached: Depth") || what.contains("recursion limit") {
        "the file nests sections or lists more deeply than any config does (a config is a \
         few levels of `key: value`); write it as plain nested mappings"
            .to_string()
    } else if what.starts_with("budget breached") {
        "the file holds, or expands into through its anchors and aliases (`&name` … `*name`: \
         an \"alias bomb\"), far more values than any config has; write a config's values out \
         plainly"
            .to_string()
    } else if what.contains("found a tab") {
        format!("{at}: a tab where YAML needs spaces; indent with spaces only")
    } else if let Some(rest) = what.strip_prefix("non-finite float `") {
        let value = rest.split('`').next().unwrap_or("");
        format!(
            "{} is {}: config values must be finite numbers; give a number",
            key.map_or("a value".to_string(), |k| format!("`{k}`")),
            clip(value)
        )
    } else if what.starts_with("multiple YAML documents") {
        format!(
            "the file holds more than one YAML document (a `---` line starts another, {at}); a \
             config is one document: remove the `---` line and keep every section in one mapping"
        )
    } else if what.contains("policy") || what.contains("from_str") || what.contains("Options") {
        // Words about the parser's settings mean nothing to a user: say where, not why.
        format!("{at}: YAML that Ember does not read here; write plain `key: value` mappings")
    } else {
        format!("{at}: {}", clip(what))
    };
    format!("not valid YAML: {said}")
}

/// Shortens any word of a message longer than 60 characters, and the whole message to 400
/// characters (a 10 MB value is not echoed back, with or without spaces in it).
fn clip(message: &str) -> String {
    const MOST: usize = 400;
    let words = clip_words(message);
    let n = words.chars().count();
    if n <= MOST {
        return words;
    }
    let head: String = words.chars().take(MOST - 60).collect();
    format!("{head}… ({n} characters in all)")
}

/// The dotted key a YAML error at `line` (1-based; `column` 1-based, if known) is at: the
/// block-style keys that enclose the line, then, inside a flow mapping (`train: { lr: .inf }`),
/// the keys of the mappings open before the column.
fn key_at(text: &str, line: usize, column: Option<usize>) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let target = *lines.get(line.checked_sub(1)?)?;
    let mut path: Vec<(usize, String)> = vec![];
    let simple = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_');
    for l in &lines[..line] {
        let trimmed = l.trim_start();
        let indent = l.len() - trimmed.len();
        let Some((k, _)) = trimmed.split_once(':') else {
            continue;
        };
        if trimmed.starts_with('#') || !simple(k.trim()) {
            continue;
        }
        while path.last().is_some_and(|(i, _)| *i >= indent) {
            path.pop();
        }
        path.push((indent, k.trim().to_string()));
    }
    let mut keys: Vec<String> = path.into_iter().map(|(_, k)| k).collect();
    // Flow mappings on the line, up to the column.
    let prefix: String = match column {
        Some(c) => target.chars().take(c.saturating_sub(1)).collect(),
        None => target.to_string(),
    };
    if prefix.contains('{') {
        let own = prefix.split_once(':').map(|(k, _)| k.trim().to_string());
        if own.is_some() && keys.last() == own.as_ref() {
            keys.pop();
        }
        let (mut stack, mut word, mut last): (Vec<String>, String, Option<String>) =
            (vec![], String::new(), None);
        for c in prefix.chars() {
            match c {
                ':' if simple(word.trim()) => {
                    last = Some(word.trim().to_string());
                    word.clear();
                }
                '{' => {
                    stack.extend(last.take());
                    word.clear();
                }
                '}' => {
                    stack.pop();
                    last = None;
                    word.clear();
                }
                ',' => {
                    last = None;
                    word.clear();
                }
                c => word.push(c),
            }
        }
        keys.extend(stack);
        keys.extend(last);
    }
    (!keys.is_empty()).then(|| keys.join("."))
}

/// The column in a serde-saphyr message ("... line 3 column 7: ...").
fn yaml_error_column(message: &str) -> Option<usize> {
    let rest = &message[message.find("column ")? + 7..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Shortens any word of a message longer than 60 characters.
fn clip_words(message: &str) -> String {
    const KEEP: usize = 40;
    let mut out = String::new();
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if word.chars().count() > 60 {
            // The count is of the value itself, without the quotes and commas around it.
            let tail: Vec<char> = word.chars().rev().take_while(|c| !c.is_alphanumeric()).collect();
            let head = word.chars().take_while(|c| !c.is_alphanumeric()).count();
            let n = word.chars().count().saturating_sub(head + tail.len());
            out.extend(word.chars().take(KEEP));
            out.push_str(&format!("… ({n} characters)"));
            out.extend(tail.into_iter().rev());
        } else {
            out.push_str(word);
        }
    }
    out
}

/// The first section (or the whole file) that is not a mapping of keys: serde's account of it
/// ("invalid type: integer `1`, expected string or map (key `model[0]`)") names neither the
/// section nor the fix.
fn misshapen_section(tree: &Value) -> Option<(String, String)> {
    let kind = |v: &Value| match v {
        Value::Array(_) => "a list",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        _ => "something else",
    };
    if !tree.is_object() {
        return Some((
            ".".into(),
            format!(
                "the file holds {} where a config needs a mapping of sections (`model:`, `data:`, \
                 `train:`, ...); see configs/quickstart.yaml",
                kind(tree)
            ),
        ));
    }
    let sections = [
        "model",
        "data",
        "data.corpus",
        "data.tokenizer",
        "train",
        "eval",
        "checkpoint",
        "ablation",
    ];
    for key in sections {
        let Some(node) = key.split('.').try_fold(tree, |node, part| node.get(part)) else {
            continue;
        };
        if !(node.is_object() || node.is_null()) {
            return Some((
                key.to_string(),
                format!(
                    "`{key}` must be a mapping of keys (`name: value` lines indented under `{}:`), \
                     but it is {}",
                    key.rsplit('.').next().unwrap_or(key),
                    kind(node)
                ),
            ));
        }
    }
    None
}

/// The line number in a serde-saphyr message ("... line 3 column 7: ...").
fn yaml_error_line(message: &str) -> Option<usize> {
    let rest = &message[message.find("line ")? + 5..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// For a `data.corpus` mapping that fails to deserialise: the offending field and message,
/// found by deserialising the variant named by `kind` on its own.
fn corpus_error(corpus: &Value) -> Option<(String, String)> {
    use ember_data::{EmbeddedConfig, HfDatasetConfig, ParallelConfig, TextConfig, TokenShardsConfig};
    fn check<T: serde::de::DeserializeOwned>(v: &Value) -> Option<(String, String)> {
        serde_path_to_error::deserialize::<_, T>(v)
            .err()
            .map(|e| (e.path().to_string(), e.into_inner().to_string()))
    }
    let mut fields = corpus.as_object()?.clone();
    let kind = fields.remove("kind")?;
    let rest = Value::Object(fields);
    let (field, message) = match kind.as_str()? {
        "embedded" => check::<EmbeddedConfig>(&rest),
        "parallel" => check::<ParallelConfig>(&rest),
        "text" => check::<TextConfig>(&rest),
        "hf_dataset" => check::<HfDatasetConfig>(&rest),
        "token_shards" => check::<TokenShardsConfig>(&rest),
        _ => None,
    }?;
    // An unknown field's path is its parent; name the field itself from serde's message.
    let field = if field == "." {
        message.split('`').nth(1).unwrap_or("kind").to_string()
    } else {
        field
    };
    Some((field, message))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// Sets `a.b.c` in a YAML tree, creating mappings on the way; refuses to descend into scalars.
fn set_path(tree: &mut Value, key: &str, value: Value) -> Result<(), String> {
    let mut node = tree;
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("malformed key {key:?}; use dotted keys like train.lr"));
    }
    for (i, part) in parts.iter().enumerate() {
        if node.is_null() {
            *node = Value::Object(Default::default());
        }
        let map = node.as_object_mut().ok_or_else(|| {
            format!(
                "{} is not a mapping, so it has no key {part:?}",
                parts[..i].join(".")
            )
        })?;
        if i + 1 == parts.len() {
            map.insert(part.to_string(), value);
            return Ok(());
        }
        node = map.entry(part.to_string()).or_insert(Value::Null);
    }
    Ok(())
}

/// Finds the 1-based line of a dotted key path in block-style YAML: each component must appear
/// as `name:` indented deeper than its parent, after the parent's line.
fn locate(text: &str, key: &str) -> Option<usize> {
    let mut start = 0;
    let mut parent_indent: isize = -1;
    let lines: Vec<&str> = text.lines().collect();
    for part in key.split('.') {
        let mut found = None;
        for (i, line) in lines.iter().enumerate().skip(start) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = (line.len() - trimmed.len()) as isize;
            if indent <= parent_indent {
                break; // left the parent's block
            }
            let name = trimmed.trim_start_matches("- ");
            if indent > parent_indent
                && (name.starts_with(&format!("{part}:")) || name.starts_with(&format!("{part} :")))
            {
                found = Some((i, indent));
                break;
            }
        }
        let (i, indent) = found?;
        start = i + 1;
        parent_indent = indent;
    }
    Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_yaml_error_is_placed_at_its_key_in_block_and_flow_style() {
        let y = "model:\n  d_model: 1\ntrain:\n  steps: 2\n  lr: .inf\n";
        assert_eq!(key_at(y, 5, Some(7)).as_deref(), Some("train.lr"));
        let y = "train: { steps: 2, lr: .nan }\n";
        assert_eq!(key_at(y, 1, Some(24)).as_deref(), Some("train.lr"));
        let y = "data:\n  corpus: { kind: text, extra: { x: .inf } }\n";
        assert_eq!(key_at(y, 2, Some(37)).as_deref(), Some("data.corpus.extra.x"));
    }

    #[test]
    fn a_long_value_is_never_echoed_whole() {
        let long = "ab ".repeat(50_000);
        let c = clip(&long);
        assert!(
            c.chars().count() < 450 && c.contains("150000 characters in all"),
            "{}",
            c.len()
        );
        assert_eq!(clip("short words stay"), "short words stay");
    }

    #[test]
    fn locate_finds_nested_keys() {
        let y = "model:\n  d_model: 1\ntrain:\n  lr: 2\n  steps: 3\n";
        assert_eq!(locate(y, "train.lr"), Some(4));
        assert_eq!(locate(y, "model.d_model"), Some(2));
        assert_eq!(locate(y, "train.nope"), None);
    }
}
