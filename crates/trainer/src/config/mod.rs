//! The run configuration: one YAML file with the sections `model`, `data`, `train`, `eval`,
//! `checkpoint`, `log`, `distributed`, `device` and `ablation`, each a struct field for field.
//!
//! Loading goes YAML text → generic tree → `--set` overrides → typed config → range checks, and
//! every failure names the file, the key path, and (where the key came from the file) its line.
//! The schema is in `schema`, the checks in `validate`, the loading in `load`, and the batch
//! shape the `train:` keys resolve to in `batching`. The same structs give the JSON Schema
//! editors read (`json_schema`), the guide's config reference (`reference`) and `ember config
//! show` (`show`).

mod batching;
mod json_schema;
mod load;
mod reference;
mod schema;
mod show;
mod validate;

pub(crate) use batching::Batched;
pub use batching::Batching;
pub use json_schema::{json_schema, json_schema_text, SCHEMA_FILE, SCHEMA_MODELINE};
pub use load::{ConfigFileError, MAX_CONFIG_BYTES};
pub use reference::{reference_markdown, REFERENCE_FILE};
pub use schema::{
    AblationConfig, CheckpointConfig, DistributedConfig, EvalConfig, KeepBestBy, LogConfig, NonFinitePolicy,
    RunConfig, Schedule, TrainConfig, DEFAULT_CPU_SHARES,
};
pub use show::{ShownConfig, Source};
pub use validate::{Invalid, MAX_ACCUMULATION, MAX_BEAM, MAX_THREADS};
