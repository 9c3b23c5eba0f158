//! Property: however a path into a protected place is spelled — through links to it or to a
//! folder above it, with `.` and `dir/..` anywhere, with a trailing `/`, through another case
//! of a name where the disk has one — the one rule of `ember_trainer::protected` refuses to
//! write there, for every kind of output, naming the protected thing; and the same spellings of
//! a place that is not protected are accepted.
//!
//! The places: a checkpoint and the `checkpoints/` folder of a run, a model folder, a Hugging
//! Face model folder, and a plain folder that a run reads with `model.init_from` (protected only
//! because that run is read). A case-insensitive disk is stood in for by links whose names differ
//! in case only (`run/Checkpoints` → `checkpoints`): the rule compares folders by identity, so a
//! link and a case-folding disk are the same to it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ember_trainer::protected::{check, Output};
use proptest::prelude::*;

/// The fixture: `run/` (a trained run with a checkpoint at step 2), `released/` (a model
/// folder), `hf/` (a Hugging Face model folder), `base/` (a plain folder that `ft/`, a run,
/// starts from with `model.init_from`), `other/` (nobody's), and `links/` of other names for
/// them.
fn root() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().canonicalize().unwrap();
        let file = |rel: &str, text: &str| {
            let path = p.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        file("run/config.yaml", "model: {}\n");
        file("run/metrics.jsonl", "");
        file("run/.lock", "");
        file("run/checkpoints/step-00000002/state.json", "{}");
        file("run/checkpoints/step-00000002/model.safetensors", "");
        file("released/model.json", "{}");
        file("released/model.safetensors", "");
        file("released/config.yaml", "");
        file("released/tokenizer.json", "{}");
        file("hf/config.json", "{}");
        file("hf/model.safetensors", "");
        file("base/weights.bin", "");
        file(
            "ft/config.yaml",
            &format!("model: {{ init_from: {} }}\n", p.join("base").display()),
        );
        file("ft/metrics.jsonl", "");
        file("ft/.lock", "");
        std::fs::create_dir_all(p.join("other/deeper")).unwrap();
        std::fs::create_dir_all(p.join("links")).unwrap();
        let link = |target: &str, name: &str| std::os::unix::fs::symlink(target, p.join(name)).unwrap();
        link("../run", "links/run");
        link("../run/checkpoints", "links/CK");
        link("checkpoints", "run/Checkpoints");
        link("../hf", "links/Hf");
        link("../base", "links/base");
        link("../released", "links/Released");
        link("../other", "links/other");
        dir
    })
    .path()
}

/// A protected place: its path from the root, the other spellings of a prefix of it (links),
/// and words the refusal must say.
struct Place {
    parts: &'static [&'static str],
    aliases: &'static [(&'static [&'static str], &'static [&'static str])],
    says: &'static str,
}

const PLACES: [Place; 5] = [
    Place {
        parts: &["run", "checkpoints", "step-00000002"],
        aliases: &[
            (&["run"], &["links", "run"]),
            (&["run", "checkpoints"], &["links", "CK"]),
            (&["run", "checkpoints"], &["run", "Checkpoints"]),
        ],
        says: "a checkpoint of the run",
    },
    Place {
        parts: &["run", "checkpoints"],
        aliases: &[
            (&["run"], &["links", "run"]),
            (&["run", "checkpoints"], &["links", "CK"]),
            (&["run", "checkpoints"], &["run", "Checkpoints"]),
        ],
        says: "checkpoints of the run",
    },
    Place {
        parts: &["released"],
        aliases: &[(&["released"], &["links", "Released"])],
        says: "model folder",
    },
    Place {
        parts: &["hf"],
        aliases: &[(&["hf"], &["links", "Hf"])],
        says: "Hugging Face model folder",
    },
    Place {
        parts: &["base"],
        aliases: &[(&["base"], &["links", "base"])],
        says: "model.init_from",
    },
];

/// How a spelling is made from a place's path: which alias (if any) replaces a prefix, where
/// `.` and `NAME/..` go, and a trailing `/`.
#[derive(Debug, Clone)]
struct Spelling {
    alias: Option<usize>,
    dots: Vec<usize>,
    back_and_forth: Vec<usize>,
    trailing_slash: bool,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (
        proptest::option::of(0usize..3),
        proptest::collection::vec(0usize..6, 0..3),
        proptest::collection::vec(0usize..6, 0..3),
        any::<bool>(),
    )
        .prop_map(|(alias, dots, back_and_forth, trailing_slash)| Spelling {
            alias,
            dots,
            back_and_forth,
            trailing_slash,
        })
}

/// `root/parts/new` spelled as `s` says. `physical` names the real folder each part ends in,
/// which is what `NAME/..` must come back to (`..` of a link goes to its target's parent).
fn spell(parts: &[&str], physical: &[&str], s: &Spelling, new: &str) -> PathBuf {
    let mut words: Vec<String> = vec![];
    for (i, part) in parts.iter().enumerate() {
        words.push(part.to_string());
        if s.dots.contains(&i) {
            words.push(".".into());
        }
        // `..` then the folder's own name: back to where it was.
        if s.back_and_forth.contains(&i) && i + 1 < parts.len() {
            if let Some(name) = physical.get(i) {
                words.push("..".into());
                words.push(name.to_string());
            }
        }
    }
    words.push(new.into());
    let mut text = root().join(words.join("/")).display().to_string();
    if s.trailing_slash {
        text.push('/');
    }
    PathBuf::from(text)
}

/// A place's parts with `s`'s alias applied, and the physical folder name of each part.
fn aliased(place: &Place, s: &Spelling) -> (Vec<&'static str>, Vec<&'static str>) {
    let plain: Vec<&str> = place.parts.to_vec();
    let Some((from, to)) = s.alias.and_then(|i| place.aliases.get(i)) else {
        return (plain.clone(), plain);
    };
    let rest = &plain[from.len()..];
    let parts: Vec<&str> = to.iter().chain(rest).copied().collect();
    // The alias's own parts end in the physical folders of `from`; the link folder (`links`)
    // is itself physical.
    let mut physical: Vec<&str> = to[..to.len() - 1].to_vec();
    physical.push(from[from.len() - 1]);
    physical.extend(rest);
    (parts, physical)
}

const KINDS: [Output; 4] = [Output::File, Output::Folder, Output::RunDir, Output::SweepDir];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_spelling_of_a_path_into_a_protected_place_is_refused_naming_it(
        which in 0usize..PLACES.len(),
        s in spelling(),
        kind in 0usize..KINDS.len(),
        new in "[a-z]{1,8}",
    ) {
        let place = &PLACES[which];
        let (parts, physical) = aliased(place, &s);
        let path = spell(&parts, &physical, &s, &new);
        let ft = root().join("ft");
        let reads: Vec<&Path> = vec![&ft];
        let refused = check(&path, "OUT", KINDS[kind], &reads, &[]);
        prop_assert!(refused.is_err(), "{} was accepted", path.display());
        let message = format!("{:#}", refused.unwrap_err());
        prop_assert!(message.contains(place.says), "{}: {message}", path.display());
        prop_assert!(message.contains("OUT"), "{message}");
    }

    #[test]
    fn the_same_spellings_of_a_place_nobody_reads_are_accepted(
        s in spelling(),
        through_link in any::<bool>(),
        new in "[a-z]{1,8}",
    ) {
        let (parts, physical): (Vec<&str>, Vec<&str>) = if through_link {
            (vec!["links", "other", "deeper"], vec!["links", "other", "deeper"])
        } else {
            (vec!["other", "deeper"], vec!["other", "deeper"])
        };
        let s = Spelling { alias: None, ..s };
        let path = spell(&parts, &physical, &s, &new);
        let ft = root().join("ft");
        for kind in [Output::File, Output::Folder] {
            let checked = check(&path, "OUT", kind, &[&ft], &[]);
            prop_assert!(checked.is_ok(), "{}: {:#}", path.display(), checked.unwrap_err());
        }
    }
}

#[test]
fn the_folder_a_config_starts_from_is_protected_for_its_own_run() {
    let base = root().join("base");
    let dir = root().join("links/base/run");
    let e = check(
        &dir,
        "--run-dir",
        Output::RunDir,
        &[],
        &[(&base, "model.init_from")],
    )
    .unwrap_err();
    assert!(
        format!("{e:#}").contains("that this run starts from (its model.init_from)"),
        "{e:#}"
    );
    // Without it, `base/` is nobody's: a run may go there.
    check(&dir, "--run-dir", Output::RunDir, &[], &[]).unwrap();
}
