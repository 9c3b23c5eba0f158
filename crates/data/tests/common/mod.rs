//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

/// The shared data folder, or `None` after printing why the caller skips.
pub fn shared_data(test: &str) -> Option<PathBuf> {
    let found = ember_data::find_shared_data();
    if found.is_none() {
        println!("SKIP {test}: no shared data (set EMBER_SHARED_DATA or run scripts/get-data.sh)");
    }
    found
}

pub fn write(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

pub fn write_gz(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    let mut enc = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    enc.write_all(contents).unwrap();
    enc.finish().unwrap();
    p
}

/// A small English/German parallel text: enough for BPE to learn a few hundred merges.
pub fn toy_parallel() -> (Vec<String>, Vec<String>) {
    let en = [
        "A man is riding a bicycle down the street.",
        "Two dogs are playing in the snow.",
        "A woman in a red dress sings on stage.",
        "Children play soccer in the park.",
        "The old man reads a newspaper, smiling.",
        "A girl jumps into the lake!",
        "Is this the \"right\" way?",
        "Three people wait at the bus stop.",
    ];
    let de = [
        "Ein Mann fährt mit dem Fahrrad die Straße hinunter.",
        "Zwei Hunde spielen im Schnee.",
        "Eine Frau in einem roten Kleid singt auf der Bühne.",
        "Kinder spielen Fußball im Park.",
        "Der alte Mann liest lächelnd eine Zeitung.",
        "Ein Mädchen springt in den See!",
        "Ist das der „richtige“ Weg?",
        "Drei Leute warten an der Bushaltestelle.",
    ];
    (
        en.iter().map(|s| s.to_string()).collect(),
        de.iter().map(|s| s.to_string()).collect(),
    )
}
