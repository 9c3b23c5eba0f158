//! The embedded task: English → German sentences about counted things, generated from a seed.
//!
//! It ships in code so a quickstart needs no download, yet it cannot be solved by copying or by
//! a word-for-word dictionary. A model has to learn:
//!
//! * **Number words with German's unit-before-tens order and compounding** — "three hundred and
//!   forty-two" → "dreihundertzweiundvierzig", "twenty-one" → "einundzwanzig", with the
//!   irregular "sechzehn", "siebzehn", "dreißig", and "eins" only when standing alone
//!   ("einhunderteins", but "einundzwanzig").
//! * **Agreement** — "one" inflects for gender and case (*ein roter Hund*, *einen roten Hund*,
//!   *einem roten Hund*, *eine rote Katze*, *ein rotes Pferd*); adjective endings follow the
//!   determiner (strong after a bare number: *drei rote Katzen*, weak after the article:
//!   *die drei roten Katzen*); dative plural nouns take *-n* (*mit drei Hunden*); weak masculine
//!   nouns take *-en* outside the nominative (*einen Löwen*); verbs agree with the subject
//!   (*ein Hund schläft* / *drei Hunde schlafen*, *du siehst*, *er sieht*).
//! * **Case from syntax** — subjects are nominative, objects accusative, *mit* takes the
//!   dative, *für*/*ohne* the accusative, and *es gibt* ("there is/are") the accusative.
//! * **Word order** — German is verb-second: a fronted time phrase moves the subject behind the
//!   verb ("Today I see …" → "Heute sehe ich …"), and a time phrase at the end of the English
//!   sentence moves into the middle field of the German one ("I see three cats today" → "Ich
//!   sehe heute drei Katzen"). Dates reorder too: "on the twenty-first of May" → "am
//!   einundzwanzigsten Mai" (dative ordinal).
//! * **Irregular English plurals** to read (mice, geese, sheep, fish, wolves, knives, …).
//!
//! # Grammar
//!
//! ```text
//! S        := TRANS | INTRANS | EXIST                       (weights 5 : 3 : 2)
//! TRANS    := [TIME] SUBJ TVERB OBJ [PP | LOC] [TIME]      (at most one TIME)
//! INTRANS  := [TIME] NP_animate IVERB [LOC] [TIME]
//! EXIST    := [TIME] "there is/are" NP_counted LOC [TIME]
//! SUBJ     := pronoun (I, you=du, he, she, we, they) | person (the man, the girl=das Mädchen, …)
//! NP       := COUNT [ADJ] NOUN | "the" [COUNT≥2] [ADJ] NOUN(sg|pl)
//! COUNT    := 1 … 999   (1 ↔ ein-/eine-/ein-; 101, 201, … excluded: their German is disputed)
//! PP       := (with → mit+dat | for → für+acc | without → ohne+acc) NP
//! TIME     := today | tomorrow | now | every day | every morning | on the weekend
//!           | in the morning | in the evening | at night | on MONDAY…SUNDAY
//!           | on the ORDINAL of MONTH   (valid days only)
//! ```
//!
//! Lexicon: 42 nouns (21 animate, 3 genders, 4 weak masculines), 19 adjectives (some only for
//! animate or inanimate nouns), 15 transitive and 7 intransitive verbs, 17 subjects, 11
//! locations, numbers 1–999, ordinals 1st–31st, 12 months, 7 weekdays. German sentences are
//! capitalised (nouns and first word), both sides end in a full stop. English sentences have
//! 3–21 words (8.6 on average; German 7.3, its numbers being single words); with the joint BPE
//! at `vocab_size: 1000` that is about 11 tokens per sentence on either side.
//!
//! Splits are generated from independent streams derived from the seed — test first, then
//! validation, then training — each skipping any English sentence already used, so the splits
//! are disjoint by source sentence and a split's content does not depend on the sizes of the
//! splits generated after it.
//!
//! The words are in `lexicon` (data only), the number words in `numbers`, and how they combine
//! into sentences in `grammar`; this module draws the splits.

mod grammar;
mod lexicon;
mod numbers;

use std::collections::HashSet;

use ember_rng::SplitMix64;

use crate::config::EmbeddedConfig;
use crate::error::{DataError, Result};

pub use grammar::sentence;
pub use numbers::{english_number, english_ordinal, german_number, german_ordinal_dative};

/// One English sentence and its German translation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pair {
    pub english: String,
    pub german: String,
}

/// The three disjoint splits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddedTask {
    pub train: Vec<Pair>,
    pub valid: Vec<Pair>,
    pub test: Vec<Pair>,
}

/// Generates the splits `cfg` asks for (deterministic in `cfg.seed`).
pub fn generate(cfg: &EmbeddedConfig) -> Result<EmbeddedTask> {
    let total = cfg.train_size as u128 + cfg.val_size as u128 + cfg.test_size as u128;
    if total > EmbeddedConfig::MAX_TOTAL_SIZE as u128 {
        return Err(DataError::config(
            "data.corpus.train_size",
            format!(
                "train_size + val_size + test_size = {total} exceeds {}; use smaller sizes",
                EmbeddedConfig::MAX_TOTAL_SIZE
            ),
        ));
    }
    let mut seen = HashSet::new();
    let test = generate_split(cfg.seed, 3, cfg.test_size, &mut seen, "data.corpus.test_size")?;
    let valid = generate_split(cfg.seed, 2, cfg.val_size, &mut seen, "data.corpus.val_size")?;
    let train = generate_split(cfg.seed, 1, cfg.train_size, &mut seen, "data.corpus.train_size")?;
    Ok(EmbeddedTask { train, valid, test })
}

fn generate_split(
    seed: u64,
    stream: u64,
    size: usize,
    seen: &mut HashSet<String>,
    key: &str,
) -> Result<Vec<Pair>> {
    let mut rng = SplitMix64::from_parts(&[seed, 0x656d_6265_6464_6564, stream]);
    let mut out = Vec::with_capacity(size);
    let max_attempts = size.saturating_mul(20).saturating_add(10_000);
    let mut attempts = 0;
    while out.len() < size {
        attempts += 1;
        if attempts > max_attempts {
            return Err(DataError::config(
                key,
                format!(
                    "could only generate {} distinct sentences; use a smaller size",
                    out.len()
                ),
            ));
        }
        let pair = sentence(&mut rng);
        if seen.insert(pair.english.clone()) {
            out.push(pair);
        }
    }
    Ok(out)
}
