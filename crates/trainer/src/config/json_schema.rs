//! The run config as a JSON Schema (draft-07), derived by schemars from the config structs
//! themselves: their doc comments become descriptions, their serde defaults `default`s, their
//! enums `oneOf` lists of constants, and their `#[schemars(...)]` attributes ranges and the rules
//! between keys. `ember config schema` prints it; `configs/ember.schema.json` is the committed
//! copy that editors read through each shipped config's first line, and the config reference of
//! the guide is written from it ([`super::reference`]), so neither can drift from the code.
//!
//! Draft-07 because it is what the YAML language server (VS Code, Neovim, Helix, …) and the
//! `jsonschema` validator the tests use both implement in full.

use serde_json::{Map, Value};

use super::RunConfig;

/// Where the committed schema lives, relative to the repository root.
pub const SCHEMA_FILE: &str = "configs/ember.schema.json";

/// The first line of every shipped config: the YAML language server reads the schema it names
/// (relative to the config's own folder).
pub const SCHEMA_MODELINE: &str = "# yaml-language-server: $schema=ember.schema.json";

/// The JSON Schema of a run config, as `ember config schema` prints it.
pub fn json_schema() -> Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let mut schema = generator.into_root_schema_for::<RunConfig>().to_value();
    if let Some(root) = schema.as_object_mut() {
        root.insert("title".into(), "Ember run config".into());
        // `$comment` is taken by the rule between sections; tools ignore `x-` keywords.
        root.insert(
            "x-generated-by".into(),
            "`ember config schema`, from Ember's config structs; do not edit by hand".into(),
        );
    }
    schema
}

/// [`json_schema`] as the committed file holds it: pretty JSON and a final newline.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}

/// [`json_schema`] and its `definitions` (what its `$ref`s name), for walking it.
pub(super) fn schema_and_definitions() -> (Value, Map<String, Value>) {
    let schema = json_schema();
    let defs = schema
        .get("definitions")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    (schema, defs)
}

/// The definition a `$ref` points to in `defs` — alone, wrapped in `allOf` (as draft-07 needs
/// beside a description or default), or in `anyOf` beside `null` (an optional section) — or
/// the schema itself.
pub(super) fn resolve<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    let wrapped = |key: &str| {
        let choices = schema.get(key)?.as_array()?;
        choices.iter().find_map(|c| c.get("$ref"))
    };
    let reference = schema
        .get("$ref")
        .or_else(|| wrapped("allOf"))
        .or_else(|| wrapped("anyOf"))
        .and_then(Value::as_str);
    reference
        .and_then(|r| r.strip_prefix("#/definitions/"))
        .and_then(|name| defs.get(name))
        .unwrap_or(schema)
}

/// The choices of an internally tagged enum (`data.corpus`): objects told apart by `kind`.
pub(super) fn variants(schema: &Value) -> Option<&Vec<Value>> {
    let choices = schema.get("oneOf")?.as_array()?;
    choices
        .iter()
        .all(|c| c.pointer("/properties/kind/const").is_some())
        .then_some(choices)
}
