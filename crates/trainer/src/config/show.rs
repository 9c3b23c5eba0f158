//! `ember config show CONFIG [--set ...]`: a config as a run would use it, every key present
//! (defaults filled in) and each value labelled with where it came from — the file, a `--set`,
//! the model folder of `model.init_from`, or the default.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::json_schema::{resolve, schema_and_definitions, variants};
use super::{ConfigFileError, RunConfig};

/// Where a resolved value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Written in the config file.
    File,
    /// Given with `--set` on the command line.
    Set,
    /// Filled in from the `config.json` of the `model.init_from` folder.
    ModelFolder,
    /// Left out: the default.
    Default,
}

impl Source {
    fn word(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Set => "--set",
            Source::ModelFolder => "model folder",
            Source::Default => "default",
        }
    }
}

/// A config resolved for `ember config show`.
#[derive(Debug, Serialize)]
pub struct ShownConfig {
    /// Every key of the config, defaults included (keys with no value are `null`).
    pub config: Value,
    /// The source of every value, by dotted key path (`train.lr`).
    pub sources: BTreeMap<String, Source>,
}

impl RunConfig {
    /// Loads and validates `path` with `overrides` as [`RunConfig::load`] does, and returns it
    /// with every key present and the source of each value.
    pub fn show(path: &Path, overrides: &[String]) -> Result<ShownConfig, ConfigFileError> {
        let text = super::load::read_text(path)?;
        let config = Self::from_yaml(&text, path, overrides)?;
        let in_file = Self::yaml_tree(&text, path, &[])?;
        let mut completed = Self::yaml_tree(&text, path, overrides)?;
        // Cannot fail: loading above did the same.
        let _ = crate::setup::init_from::complete(&mut completed);
        let mut resolved = serde_json::to_value(&config).unwrap_or(Value::Null);
        let (schema, defs) = schema_and_definitions();
        fill(&mut resolved, &schema, &defs);
        let set_keys: Vec<&str> = overrides
            .iter()
            .filter_map(|o| Some(o.split_once('=')?.0))
            .collect();
        let mut sources = BTreeMap::new();
        for key in leaves(&resolved, "") {
            let source = if set_keys
                .iter()
                .any(|k| key == *k || key.starts_with(&format!("{k}.")))
            {
                Source::Set
            } else if lookup(&in_file, &key).is_some() {
                Source::File
            } else if lookup(&completed, &key).is_some() {
                Source::ModelFolder
            } else {
                Source::Default
            };
            sources.insert(key, source);
        }
        Ok(ShownConfig {
            config: resolved,
            sources,
        })
    }
}

impl ShownConfig {
    /// The config as YAML (which `ember train` reads back as the same config), each value
    /// followed by a comment naming its source.
    pub fn to_commented_yaml(&self) -> String {
        let mut lines = vec![];
        self.lines(&self.config, "", 0, &mut lines);
        let width = lines.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0);
        let mut out = String::new();
        for (line, source) in lines {
            match source {
                Some(s) => {
                    let pad = width - line.chars().count();
                    let _ = writeln!(out, "{line}{}  # {}", " ".repeat(pad), s.word());
                }
                None => {
                    let _ = writeln!(out, "{line}");
                }
            }
        }
        out
    }

    fn lines(&self, value: &Value, path: &str, depth: usize, out: &mut Vec<(String, Option<Source>)>) {
        let Some(map) = value.as_object() else { return };
        for (key, v) in map {
            let full = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let indent = "  ".repeat(depth);
            match v {
                Value::Object(m) if !m.is_empty() => {
                    out.push((format!("{indent}{key}:"), None));
                    self.lines(v, &full, depth + 1, out);
                }
                _ => out.push((
                    format!("{indent}{key}: {}", yaml_value(v)),
                    self.sources.get(&full).copied(),
                )),
            }
        }
    }
}

/// Adds every key the schema knows and `value` lacks, with its default (or null), recursively;
/// for a choice of sections (`data.corpus`) the one its `kind` names.
fn fill(value: &mut Value, schema: &Value, defs: &Map<String, Value>) {
    let mut object = resolve(schema, defs);
    if let Some(choices) = variants(object) {
        let kind = value.get("kind").cloned();
        match choices
            .iter()
            .find(|c| c.pointer("/properties/kind/const") == kind.as_ref())
        {
            Some(choice) => object = choice,
            None => return,
        }
    }
    let (Some(props), Some(map)) = (
        object.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) else {
        return;
    };
    for (key, prop) in props {
        let entry = map
            .entry(key.clone())
            .or_insert_with(|| prop.get("default").cloned().unwrap_or(Value::Null));
        if entry.is_object() {
            fill(entry, prop, defs);
        }
    }
}

/// The dotted paths of every value that is not a non-empty mapping.
fn leaves(value: &Value, path: &str) -> Vec<String> {
    match value.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .flat_map(|(k, v)| {
                leaves(
                    v,
                    &if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    },
                )
            })
            .collect(),
        _ => vec![path.to_string()],
    }
}

fn lookup<'a>(tree: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(tree, |node, part| node.get(part))
}

/// A value in YAML's flow style: plain where YAML reads it back as the same string, else quoted
/// as JSON (which YAML reads too).
fn yaml_value(value: &Value) -> String {
    match value {
        Value::String(s) => {
            let plain = s.chars().all(|c| c.is_alphanumeric() || "_./-".contains(c))
                && s.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '.' || c == '/' || c == '_')
                && !matches!(
                    s.to_ascii_lowercase().as_str(),
                    "null" | "true" | "false" | "yes" | "no" | "on" | "off" | "~" | ".inf" | ".nan"
                );
            if plain {
                s.clone()
            } else {
                Value::String(s.clone()).to_string()
            }
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(yaml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) if m.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}
