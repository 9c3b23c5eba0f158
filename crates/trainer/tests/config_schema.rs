//! Specification: the JSON Schema of the run config (`configs/ember.schema.json`, which editors
//! read through each shipped config's first line) and the config reference of the guide are
//! what the code generates, and the schema's own validation agrees with Ember's verdict on every
//! shipped config and every config the config specifications feed to Ember.
//!
//! When a config struct changes, regenerate both files with
//! `EMBER_BLESS=1 cargo test --release -p ember-trainer --test config_schema`.

use std::path::{Path, PathBuf};

use ember_trainer::config::{
    json_schema, json_schema_text, reference_markdown, RunConfig, REFERENCE_FILE, SCHEMA_FILE,
    SCHEMA_MODELINE,
};
use serde_json::Value;

mod config_cases;

use config_cases::{cases, load_shipped, shipped_configs, unparsable};

const REGENERATE: &str = "EMBER_BLESS=1 cargo test --release -p ember-trainer --test config_schema";

fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// Compares a committed generated file with what the code generates now; with `EMBER_BLESS=1`
/// writes it instead.
fn check_generated(relative: &str, generated: &str) {
    let path = repo_file(relative);
    if std::env::var_os("EMBER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or(
                committed.lines().count().min(generated.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "{relative} is not what the config structs generate (first difference at line {line}). \
             Regenerate it with:\n    {REGENERATE}\nand commit the result."
        );
    }
}

#[test]
fn the_committed_schema_is_what_the_code_generates() {
    check_generated(SCHEMA_FILE, &json_schema_text());
}

#[test]
fn the_committed_config_reference_is_what_the_code_generates() {
    check_generated(REFERENCE_FILE, &reference_markdown());
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft7::new(&json_schema()).expect("the generated schema is a valid draft-07 schema")
}

/// The schema's verdict: the messages of the rules a tree breaks (none for a valid tree).
fn schema_errors(validator: &jsonschema::Validator, tree: &Value) -> Vec<String> {
    validator
        .iter_errors(tree)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn every_shipped_config_names_the_schema_on_its_first_line_and_is_valid_by_it() {
    let validator = validator();
    let tmp = tempfile::tempdir().unwrap();
    for path in shipped_configs() {
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().next(),
            Some(SCHEMA_MODELINE),
            "{}: every shipped config starts with the YAML language server's modeline",
            path.display()
        );
        let named = path
            .parent()
            .unwrap()
            .join(SCHEMA_MODELINE.rsplit('=').next().unwrap());
        assert_eq!(
            named.canonicalize().unwrap(),
            repo_file(SCHEMA_FILE).canonicalize().unwrap()
        );
        // As an editor sees the file (it cannot read the model folder of `model.init_from`).
        let tree = RunConfig::yaml_tree(&text, &path, &[]).unwrap();
        let errors = schema_errors(&validator, &tree);
        assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
        load_shipped(&path, tmp.path());
    }
}

#[test]
fn the_schema_gives_embers_verdict_on_every_config_the_specifications_use() {
    let validator = validator();
    let mut refused = 0;
    for case in cases() {
        let path = Path::new("case.yaml");
        let ember = RunConfig::from_yaml(&case.text, path, &case.overrides);
        let tree = RunConfig::yaml_tree(&case.text, path, &case.overrides)
            .unwrap_or_else(|e| panic!("{}: the YAML should parse: {e}", case.name));
        let errors = schema_errors(&validator, &tree);
        let name = case.name;
        match (&ember, errors.is_empty(), case.beyond_schema) {
            (Ok(_), true, None) => {}
            (Err(_), false, None) => refused += 1,
            (Err(_), true, Some(_)) => {}
            (Ok(_), false, None) => panic!("{name}: Ember accepts it but the schema refuses it: {errors:#?}"),
            (Err(e), true, None) => panic!("{name}: Ember refuses it ({e}) but the schema accepts it"),
            (_, _, Some(rule)) => panic!(
                "{name}: expected Ember alone to refuse it ({rule}, which a JSON Schema cannot state); \
                 Ember: {:?}, schema: {errors:#?}",
                ember.err().map(|e| e.to_string())
            ),
        }
    }
    assert!(
        refused >= 40,
        "only {refused} hostile configs were refused by both"
    );
}

#[test]
fn what_does_not_parse_is_refused_by_ember_before_any_schema_applies() {
    for case in unparsable() {
        let path = Path::new("case.yaml");
        assert!(
            RunConfig::yaml_tree(&case.text, path, &case.overrides).is_err(),
            "{}: parses",
            case.name
        );
        assert!(
            RunConfig::from_yaml(&case.text, path, &case.overrides).is_err(),
            "{}: Ember accepts it",
            case.name
        );
    }
}
