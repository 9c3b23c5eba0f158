//! Fetching a Hugging Face dataset into the local Hugging Face cache (cargo feature `hf-hub`).
//!
//! candle-datasets' `hub::from_hub` lists the dataset's parquet conversion on the Hub and
//! downloads every file of it into the cache that the Python tools share; Ember then reads the
//! files from there like any local folder ([`crate::hf_dataset`]), so tokenisation, batching and
//! resuming are Ember's own. The readers `from_hub` returns are dropped: Ember chooses the config,
//! split and columns itself, which `from_hub` cannot.
//!
//! Behind a feature because of what it costs the default build: candle-datasets brings hf-hub's
//! HTTP stack (reqwest, tokio, rustls with aws-lc's C build, hf-xet) and its own image and
//! tokenizer dependencies: 192 more crates, more than twice the compile work of a clean build
//! (measured in docs/ecosystem.md). Without the feature, a dataset already in the cache, or a
//! local folder, is read all the same.

use crate::error::{DataError, Result};

/// Downloads the parquet files of Hub dataset `repo` (`owner/name`) into the Hugging Face cache.
pub fn fetch(repo: &str) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| {
        DataError::config(
            "data.corpus.repo",
            format!(
                "fetching {repo} from the Hugging Face Hub failed: {e}. Check the dataset id and the \
                 network (HF_TOKEN for gated datasets, HF_ENDPOINT for a mirror)"
            ),
        )
    };
    let client = hf_hub::HFClientSync::new().map_err(|e| err(&e))?;
    let files = candle_datasets::hub::from_hub(&client, repo.to_string()).map_err(|e| err(&e))?;
    if files.is_empty() {
        return Err(err(&"the dataset has no parquet conversion"));
    }
    Ok(())
}
