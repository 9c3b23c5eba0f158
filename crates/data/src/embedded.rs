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

use std::collections::HashSet;

use ember_rng::SplitMix64;

use crate::config::EmbeddedConfig;
use crate::error::{DataError, Result};

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

// ---------------------------------------------------------------------------------------------
// Lexicon
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gender {
    Masc,
    Fem,
    Neut,
}
use Gender::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Nom,
    Acc,
    Dat,
}

#[derive(Debug)]
struct Noun {
    en: &'static str,
    en_pl: &'static str,
    gender: Gender,
    /// Nominative singular.
    de: &'static str,
    /// Accusative/dative singular (differs only for weak masculines: Löwe → Löwen).
    de_oblique: &'static str,
    de_pl: &'static str,
    animate: bool,
}

impl Noun {
    fn de_sg(&self, case: Case) -> &'static str {
        if case == Case::Nom {
            self.de
        } else {
            self.de_oblique
        }
    }

    /// Plural form; the dative plural adds -n unless the plural already ends in -n or -s.
    fn de_plural(&self, case: Case) -> String {
        if case == Case::Dat && !self.de_pl.ends_with('n') && !self.de_pl.ends_with('s') {
            format!("{}n", self.de_pl)
        } else {
            self.de_pl.to_string()
        }
    }
}

const fn noun(
    en: &'static str,
    en_pl: &'static str,
    gender: Gender,
    de: &'static str,
    de_pl: &'static str,
    animate: bool,
) -> Noun {
    Noun {
        en,
        en_pl,
        gender,
        de,
        de_oblique: de,
        de_pl,
        animate,
    }
}

const fn weak(en: &'static str, en_pl: &'static str, de: &'static str, de_oblique: &'static str) -> Noun {
    Noun {
        en,
        en_pl,
        gender: Masc,
        de,
        de_oblique,
        de_pl: de_oblique,
        animate: true,
    }
}

const NOUNS: &[Noun] = &[
    // animate
    noun("dog", "dogs", Masc, "Hund", "Hunde", true),
    noun("bird", "birds", Masc, "Vogel", "Vögel", true),
    noun("fish", "fish", Masc, "Fisch", "Fische", true),
    noun("frog", "frogs", Masc, "Frosch", "Frösche", true),
    noun("wolf", "wolves", Masc, "Wolf", "Wölfe", true),
    noun("fox", "foxes", Masc, "Fuchs", "Füchse", true),
    weak("lion", "lions", "Löwe", "Löwen"),
    weak("bear", "bears", "Bär", "Bären"),
    weak("rabbit", "rabbits", "Hase", "Hasen"),
    weak("monkey", "monkeys", "Affe", "Affen"),
    noun("cat", "cats", Fem, "Katze", "Katzen", true),
    noun("mouse", "mice", Fem, "Maus", "Mäuse", true),
    noun("cow", "cows", Fem, "Kuh", "Kühe", true),
    noun("goose", "geese", Fem, "Gans", "Gänse", true),
    noun("duck", "ducks", Fem, "Ente", "Enten", true),
    noun("goat", "goats", Fem, "Ziege", "Ziegen", true),
    noun("horse", "horses", Neut, "Pferd", "Pferde", true),
    noun("sheep", "sheep", Neut, "Schaf", "Schafe", true),
    noun("pig", "pigs", Neut, "Schwein", "Schweine", true),
    noun("chicken", "chickens", Neut, "Huhn", "Hühner", true),
    noun("camel", "camels", Neut, "Kamel", "Kamele", true),
    // inanimate
    noun("apple", "apples", Masc, "Apfel", "Äpfel", false),
    noun("chair", "chairs", Masc, "Stuhl", "Stühle", false),
    noun("table", "tables", Masc, "Tisch", "Tische", false),
    noun("ball", "balls", Masc, "Ball", "Bälle", false),
    noun("key", "keys", Masc, "Schlüssel", "Schlüssel", false),
    noun("spoon", "spoons", Masc, "Löffel", "Löffel", false),
    noun("stone", "stones", Masc, "Stein", "Steine", false),
    noun("hat", "hats", Masc, "Hut", "Hüte", false),
    noun("flower", "flowers", Fem, "Blume", "Blumen", false),
    noun("cup", "cups", Fem, "Tasse", "Tassen", false),
    noun("lamp", "lamps", Fem, "Lampe", "Lampen", false),
    noun("bottle", "bottles", Fem, "Flasche", "Flaschen", false),
    noun("candle", "candles", Fem, "Kerze", "Kerzen", false),
    noun("pear", "pears", Fem, "Birne", "Birnen", false),
    noun("tomato", "tomatoes", Fem, "Tomate", "Tomaten", false),
    noun("book", "books", Neut, "Buch", "Bücher", false),
    noun("house", "houses", Neut, "Haus", "Häuser", false),
    noun("egg", "eggs", Neut, "Ei", "Eier", false),
    noun("glass", "glasses", Neut, "Glas", "Gläser", false),
    noun("knife", "knives", Neut, "Messer", "Messer", false),
    noun("car", "cars", Neut, "Auto", "Autos", false),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fits {
    Any,
    Animate,
    Inanimate,
}

/// English adjective, German stem (endings are added by declension), what it may describe.
const ADJECTIVES: &[(&str, &str, Fits)] = &[
    ("red", "rot", Fits::Any),
    ("blue", "blau", Fits::Inanimate),
    ("green", "grün", Fits::Any),
    ("yellow", "gelb", Fits::Any),
    ("black", "schwarz", Fits::Any),
    ("white", "weiß", Fits::Any),
    ("brown", "braun", Fits::Any),
    ("small", "klein", Fits::Any),
    ("big", "groß", Fits::Any),
    ("old", "alt", Fits::Any),
    ("beautiful", "schön", Fits::Any),
    ("new", "neu", Fits::Inanimate),
    ("cheap", "billig", Fits::Inanimate),
    ("young", "jung", Fits::Animate),
    ("hungry", "hungrig", Fits::Animate),
    ("tired", "müd", Fits::Animate),
    ("wild", "wild", Fits::Animate),
    ("fat", "dick", Fits::Animate),
    ("funny", "lustig", Fits::Animate),
];

struct TransitiveVerb {
    en: &'static str,
    en_3sg: &'static str,
    /// ich, du, er/sie/es, wir, sie (plural).
    de: [&'static str; 5],
    animate_object: bool,
}

const fn tv(
    en: &'static str,
    en_3sg: &'static str,
    de: [&'static str; 5],
    animate_object: bool,
) -> TransitiveVerb {
    TransitiveVerb {
        en,
        en_3sg,
        de,
        animate_object,
    }
}

const TRANSITIVE: &[TransitiveVerb] = &[
    tv(
        "see",
        "sees",
        ["sehe", "siehst", "sieht", "sehen", "sehen"],
        false,
    ),
    tv("have", "has", ["habe", "hast", "hat", "haben", "haben"], false),
    tv(
        "buy",
        "buys",
        ["kaufe", "kaufst", "kauft", "kaufen", "kaufen"],
        false,
    ),
    tv(
        "need",
        "needs",
        ["brauche", "brauchst", "braucht", "brauchen", "brauchen"],
        false,
    ),
    tv(
        "find",
        "finds",
        ["finde", "findest", "findet", "finden", "finden"],
        false,
    ),
    tv(
        "count",
        "counts",
        ["zähle", "zählst", "zählt", "zählen", "zählen"],
        false,
    ),
    tv(
        "paint",
        "paints",
        ["male", "malst", "malt", "malen", "malen"],
        false,
    ),
    tv(
        "sell",
        "sells",
        ["verkaufe", "verkaufst", "verkauft", "verkaufen", "verkaufen"],
        false,
    ),
    tv(
        "carry",
        "carries",
        ["trage", "trägst", "trägt", "tragen", "tragen"],
        false,
    ),
    tv("like", "likes", ["mag", "magst", "mag", "mögen", "mögen"], false),
    tv(
        "take",
        "takes",
        ["nehme", "nimmst", "nimmt", "nehmen", "nehmen"],
        false,
    ),
    tv(
        "wash",
        "washes",
        ["wasche", "wäschst", "wäscht", "waschen", "waschen"],
        false,
    ),
    tv(
        "draw",
        "draws",
        ["zeichne", "zeichnest", "zeichnet", "zeichnen", "zeichnen"],
        false,
    ),
    tv(
        "hold",
        "holds",
        ["halte", "hältst", "hält", "halten", "halten"],
        false,
    ),
    tv(
        "feed",
        "feeds",
        ["füttere", "fütterst", "füttert", "füttern", "füttern"],
        true,
    ),
];

/// English base, English 3sg, German 3sg, German 3pl.
const INTRANSITIVE: &[(&str, &str, &str, &str)] = &[
    ("sleep", "sleeps", "schläft", "schlafen"),
    ("run", "runs", "läuft", "laufen"),
    ("wait", "waits", "wartet", "warten"),
    ("play", "plays", "spielt", "spielen"),
    ("swim", "swims", "schwimmt", "schwimmen"),
    ("jump", "jumps", "springt", "springen"),
    ("sit", "sits", "sitzt", "sitzen"),
];

/// English subject, German subject, person index into `TransitiveVerb::de`.
const SUBJECTS: &[(&str, &str, usize)] = &[
    ("I", "ich", 0),
    ("you", "du", 1),
    ("he", "er", 2),
    ("she", "sie", 2),
    ("we", "wir", 3),
    ("they", "sie", 4),
    ("the man", "der Mann", 2),
    ("the woman", "die Frau", 2),
    ("the child", "das Kind", 2),
    ("the boy", "der Junge", 2),
    ("the girl", "das Mädchen", 2),
    ("the farmer", "der Bauer", 2),
    ("my father", "mein Vater", 2),
    ("my mother", "meine Mutter", 2),
    ("the children", "die Kinder", 4),
    ("the men", "die Männer", 4),
    ("the women", "die Frauen", 4),
];

const LOCATIONS: &[(&str, &str)] = &[
    ("in the garden", "im Garten"),
    ("in the kitchen", "in der Küche"),
    ("in the park", "im Park"),
    ("in the forest", "im Wald"),
    ("on the farm", "auf dem Bauernhof"),
    ("in the house", "im Haus"),
    ("at the lake", "am See"),
    ("in the city", "in der Stadt"),
    ("on the street", "auf der Straße"),
    ("at the station", "am Bahnhof"),
    ("at the zoo", "im Zoo"),
];

const SIMPLE_TIMES: &[(&str, &str)] = &[
    ("today", "heute"),
    ("tomorrow", "morgen"),
    ("now", "jetzt"),
    ("every day", "jeden Tag"),
    ("every morning", "jeden Morgen"),
    ("on the weekend", "am Wochenende"),
    ("in the morning", "am Morgen"),
    ("in the evening", "am Abend"),
    ("at night", "in der Nacht"),
];

const WEEKDAYS: &[(&str, &str)] = &[
    ("Monday", "Montag"),
    ("Tuesday", "Dienstag"),
    ("Wednesday", "Mittwoch"),
    ("Thursday", "Donnerstag"),
    ("Friday", "Freitag"),
    ("Saturday", "Samstag"),
    ("Sunday", "Sonntag"),
];

/// English, German, days in the month (29 for February: leap years exist).
const MONTHS: &[(&str, &str, u32)] = &[
    ("January", "Januar", 31),
    ("February", "Februar", 29),
    ("March", "März", 31),
    ("April", "April", 30),
    ("May", "Mai", 31),
    ("June", "Juni", 30),
    ("July", "Juli", 31),
    ("August", "August", 31),
    ("September", "September", 30),
    ("October", "Oktober", 31),
    ("November", "November", 30),
    ("December", "Dezember", 31),
];

// ---------------------------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------------------------

const EN_ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const EN_TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];
const DE_ONES: [&str; 20] = [
    "null",
    "eins",
    "zwei",
    "drei",
    "vier",
    "fünf",
    "sechs",
    "sieben",
    "acht",
    "neun",
    "zehn",
    "elf",
    "zwölf",
    "dreizehn",
    "vierzehn",
    "fünfzehn",
    "sechzehn",
    "siebzehn",
    "achtzehn",
    "neunzehn",
];
const DE_TENS: [&str; 10] = [
    "", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig",
];

/// English cardinal, British style: 342 → "three hundred and forty-two". Valid for 0..=999.
pub fn english_number(n: u32) -> String {
    match n {
        0..=19 => EN_ONES[n as usize].to_string(),
        20..=99 => {
            let (t, u) = (n / 10, n % 10);
            if u == 0 {
                EN_TENS[t as usize].to_string()
            } else {
                format!("{}-{}", EN_TENS[t as usize], EN_ONES[u as usize])
            }
        }
        _ => {
            let (h, r) = (n / 100 % 10, n % 100);
            if r == 0 {
                format!("{} hundred", EN_ONES[h as usize])
            } else {
                format!("{} hundred and {}", EN_ONES[h as usize], english_number(r))
            }
        }
    }
}

/// German cardinal as one word: 342 → "dreihundertzweiundvierzig", 101 → "einhunderteins".
/// Valid for 0..=999.
pub fn german_number(n: u32) -> String {
    // "eins" loses its s inside a compound: einundzwanzig, einhundert.
    let unit_in_compound = |u: u32| if u == 1 { "ein" } else { DE_ONES[u as usize] };
    match n {
        0..=19 => DE_ONES[n as usize].to_string(),
        20..=99 => {
            let (t, u) = (n / 10, n % 10);
            if u == 0 {
                DE_TENS[t as usize].to_string()
            } else {
                format!("{}und{}", unit_in_compound(u), DE_TENS[t as usize])
            }
        }
        _ => {
            let (h, r) = (n / 100 % 10, n % 100);
            let rest = if r == 0 { String::new() } else { german_number(r) };
            format!("{}hundert{rest}", unit_in_compound(h))
        }
    }
}

/// English ordinal for days of the month: 21 → "twenty-first". Valid for 1..=99.
pub fn english_ordinal(n: u32) -> String {
    const IRREGULAR: [&str; 20] = [
        "zeroth",
        "first",
        "second",
        "third",
        "fourth",
        "fifth",
        "sixth",
        "seventh",
        "eighth",
        "ninth",
        "tenth",
        "eleventh",
        "twelfth",
        "thirteenth",
        "fourteenth",
        "fifteenth",
        "sixteenth",
        "seventeenth",
        "eighteenth",
        "nineteenth",
    ];
    const TENS: [&str; 10] = [
        "",
        "",
        "twentieth",
        "thirtieth",
        "fortieth",
        "fiftieth",
        "sixtieth",
        "seventieth",
        "eightieth",
        "ninetieth",
    ];
    let (tens, unit) = ((n / 10 % 10) as usize, (n % 10) as usize);
    match (n, unit) {
        (0..=19, _) => IRREGULAR[n as usize].to_string(),
        (_, 0) => TENS[tens].to_string(),
        _ => format!("{}-{}", EN_TENS[tens], IRREGULAR[unit]),
    }
}

/// German ordinal in the weak dative/accusative form used after "am": 1 → "ersten",
/// 7 → "siebten", 21 → "einundzwanzigsten". Valid for 1..=99.
pub fn german_ordinal_dative(n: u32) -> String {
    match n {
        1 => "ersten".to_string(),
        3 => "dritten".to_string(),
        7 => "siebten".to_string(),
        8 => "achten".to_string(),
        2..=19 => format!("{}ten", DE_ONES[n as usize]),
        _ => format!("{}sten", german_number(n)),
    }
}

// ---------------------------------------------------------------------------------------------
// Phrases
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Det {
    /// A bare number: 1 inflects like the indefinite article, others take a plural noun.
    Count(u32),
    /// The definite article, optionally with a number ≥ 2; `plural` decides the noun form.
    The { plural: bool, count: Option<u32> },
}

struct NounPhrase {
    det: Det,
    adj: Option<(&'static str, &'static str)>,
    noun: &'static Noun,
}

impl NounPhrase {
    fn plural(&self) -> bool {
        match self.det {
            Det::Count(n) => n != 1,
            Det::The { plural, .. } => plural,
        }
    }

    fn english(&self) -> String {
        let mut words: Vec<String> = Vec::with_capacity(4);
        match self.det {
            Det::Count(n) => words.push(english_number(n)),
            Det::The { count, .. } => {
                words.push("the".into());
                if let Some(n) = count {
                    words.push(english_number(n));
                }
            }
        }
        if let Some((en, _)) = self.adj {
            words.push(en.into());
        }
        words.push(
            if self.plural() {
                self.noun.en_pl
            } else {
                self.noun.en
            }
            .into(),
        );
        words.join(" ")
    }

    fn german(&self, case: Case) -> String {
        let g = self.noun.gender;
        let mut words: Vec<String> = Vec::with_capacity(4);
        // Adjective ending by declension type.
        let ending: &str = match self.det {
            Det::Count(1) => {
                words.push(indefinite_article(g, case).into());
                match (g, case) {
                    (Masc, Case::Nom) => "er",
                    (Neut, Case::Nom | Case::Acc) => "es",
                    (Fem, Case::Nom | Case::Acc) => "e",
                    _ => "en",
                }
            }
            Det::Count(n) => {
                words.push(german_number(n));
                if case == Case::Dat {
                    "en"
                } else {
                    "e"
                }
            }
            Det::The { plural, count } => {
                words.push(definite_article(g, case, plural).into());
                if let Some(n) = count {
                    words.push(german_number(n));
                }
                match (plural, g, case) {
                    (true, _, _) => "en",
                    (false, _, Case::Nom) => "e",
                    (false, Fem | Neut, Case::Acc) => "e",
                    _ => "en",
                }
            }
        };
        if let Some((_, stem)) = self.adj {
            words.push(format!("{stem}{ending}"));
        }
        words.push(if self.plural() {
            self.noun.de_plural(case)
        } else {
            self.noun.de_sg(case).to_string()
        });
        words.join(" ")
    }
}

fn indefinite_article(g: Gender, case: Case) -> &'static str {
    match (g, case) {
        (Masc, Case::Nom) | (Neut, Case::Nom | Case::Acc) => "ein",
        (Masc, Case::Acc) => "einen",
        (Masc | Neut, Case::Dat) => "einem",
        (Fem, Case::Nom | Case::Acc) => "eine",
        (Fem, Case::Dat) => "einer",
    }
}

fn definite_article(g: Gender, case: Case, plural: bool) -> &'static str {
    if plural {
        return if case == Case::Dat { "den" } else { "die" };
    }
    match (g, case) {
        (Masc, Case::Nom) => "der",
        (Masc, Case::Acc) => "den",
        (Masc | Neut, Case::Dat) => "dem",
        (Fem, Case::Nom | Case::Acc) => "die",
        (Fem, Case::Dat) => "der",
        (Neut, Case::Nom | Case::Acc) => "das",
    }
}

/// A count for a noun phrase: small numbers are most common, as in text.
fn sample_count(rng: &mut SplitMix64) -> u32 {
    let r = rng.below(100);
    if r < 25 {
        1
    } else if r < 55 {
        2 + rng.below(11) as u32 // 2..=12
    } else if r < 80 {
        13 + rng.below(87) as u32 // 13..=99
    } else {
        loop {
            // 100..=999 without 101, 201, …: "hundertein(s) Hunde" has no settled German form.
            let n = 100 + rng.below(900) as u32;
            if n % 100 != 1 {
                return n;
            }
        }
    }
}

fn pick_noun(rng: &mut SplitMix64, animate: Option<bool>) -> &'static Noun {
    loop {
        let n = rng.pick(NOUNS);
        if animate.is_none_or(|a| n.animate == a) {
            return n;
        }
    }
}

fn pick_adjective(rng: &mut SplitMix64, noun: &Noun) -> Option<(&'static str, &'static str)> {
    if !rng.chance(0.5) {
        return None;
    }
    loop {
        let &(en, de, fits) = rng.pick(ADJECTIVES);
        let ok = match fits {
            Fits::Any => true,
            Fits::Animate => noun.animate,
            Fits::Inanimate => !noun.animate,
        };
        if ok {
            return Some((en, de));
        }
    }
}

/// A noun phrase; `counted_only` excludes the definite article (for "there is/are").
fn noun_phrase(rng: &mut SplitMix64, animate: Option<bool>, counted_only: bool) -> NounPhrase {
    let noun = pick_noun(rng, animate);
    let det = if counted_only || rng.chance(0.75) {
        Det::Count(sample_count(rng))
    } else {
        let plural = rng.chance(0.6);
        let count = if plural && rng.chance(0.6) {
            let mut n = sample_count(rng);
            while n == 1 {
                n = sample_count(rng);
            }
            Some(n)
        } else {
            None
        };
        Det::The { plural, count }
    };
    let adj = pick_adjective(rng, noun);
    NounPhrase { det, adj, noun }
}

fn time_phrase(rng: &mut SplitMix64) -> (String, String) {
    let r = rng.below(10);
    if r < 5 {
        let &(en, de) = rng.pick(SIMPLE_TIMES);
        (en.into(), de.into())
    } else if r < 7 {
        let &(en, de) = rng.pick(WEEKDAYS);
        (format!("on {en}"), format!("am {de}"))
    } else {
        let &(en, de, days) = rng.pick(MONTHS);
        let day = 1 + rng.below(days as u64) as u32;
        (
            format!("on the {} of {en}", english_ordinal(day)),
            format!("am {} {de}", german_ordinal_dative(day)),
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TimePos {
    None,
    Front,
    End,
}

fn time_position(rng: &mut SplitMix64) -> TimePos {
    match rng.below(4) {
        0 => TimePos::Front,
        1 => TimePos::End,
        _ => TimePos::None,
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn finish(en: Vec<String>, de: Vec<String>) -> Pair {
    let join = |v: Vec<String>| {
        let s: Vec<String> = v.into_iter().filter(|w| !w.is_empty()).collect();
        format!("{}.", capitalise(&s.join(" ")))
    };
    Pair {
        english: join(en),
        german: join(de),
    }
}

/// One random sentence pair from the grammar in the module docs.
pub fn sentence(rng: &mut SplitMix64) -> Pair {
    let kind = rng.below(10);
    let tpos = time_position(rng);
    let (t_en, t_de) = if tpos == TimePos::None {
        (String::new(), String::new())
    } else {
        time_phrase(rng)
    };
    let front = |s: &String| {
        if tpos == TimePos::Front {
            s.clone()
        } else {
            String::new()
        }
    };
    let end = |s: &String| {
        if tpos == TimePos::End {
            s.clone()
        } else {
            String::new()
        }
    };

    if kind < 5 {
        // TRANS: [TIME] SUBJ TVERB OBJ [PP | LOC] [TIME]
        let &(s_en, s_de, person) = rng.pick(SUBJECTS);
        let verb = rng.pick(TRANSITIVE);
        let obj = noun_phrase(rng, if verb.animate_object { Some(true) } else { None }, false);
        let (x_en, x_de) = match rng.below(10) {
            0..=2 => {
                let (p_en, p_de, case) = *rng.pick(&[
                    ("with", "mit", Case::Dat),
                    ("for", "für", Case::Acc),
                    ("without", "ohne", Case::Acc),
                ]);
                let np = noun_phrase(rng, None, false);
                (
                    format!("{p_en} {}", np.english()),
                    format!("{p_de} {}", np.german(case)),
                )
            }
            3..=4 => {
                let &(en, de) = rng.pick(LOCATIONS);
                (en.to_string(), de.to_string())
            }
            _ => (String::new(), String::new()),
        };
        let v_en = if person == 2 { verb.en_3sg } else { verb.en };
        let v_de = verb.de[person].to_string();
        let en = vec![
            front(&t_en),
            s_en.into(),
            v_en.into(),
            obj.english(),
            x_en,
            end(&t_en),
        ];
        let de = match tpos {
            TimePos::Front => vec![t_de, v_de, s_de.into(), obj.german(Case::Acc), x_de],
            TimePos::End => vec![s_de.into(), v_de, t_de, obj.german(Case::Acc), x_de],
            TimePos::None => vec![s_de.into(), v_de, obj.german(Case::Acc), x_de],
        };
        finish(en, de)
    } else if kind < 8 {
        // INTRANS: [TIME] NP_animate IVERB [LOC] [TIME]
        let subj = noun_phrase(rng, Some(true), false);
        let &(en_base, en_3sg, de_3sg, de_3pl) = rng.pick(INTRANSITIVE);
        let (l_en, l_de) = if rng.chance(0.5) {
            let &(en, de) = rng.pick(LOCATIONS);
            (en.to_string(), de.to_string())
        } else {
            (String::new(), String::new())
        };
        let (v_en, v_de) = if subj.plural() {
            (en_base, de_3pl)
        } else {
            (en_3sg, de_3sg)
        };
        let en = vec![front(&t_en), subj.english(), v_en.into(), l_en, end(&t_en)];
        let de = match tpos {
            TimePos::Front => vec![t_de, v_de.into(), subj.german(Case::Nom), l_de],
            TimePos::End => vec![subj.german(Case::Nom), v_de.into(), t_de, l_de],
            TimePos::None => vec![subj.german(Case::Nom), v_de.into(), l_de],
        };
        finish(en, de)
    } else {
        // EXIST: [TIME] there is/are NP LOC [TIME]  →  es gibt + accusative
        let np = noun_phrase(rng, None, true);
        let &(l_en, l_de) = rng.pick(LOCATIONS);
        let be = if np.plural() { "there are" } else { "there is" };
        let en = vec![front(&t_en), be.into(), np.english(), l_en.into(), end(&t_en)];
        let de = match tpos {
            TimePos::Front => vec![t_de, "gibt es".into(), np.german(Case::Acc), l_de.into()],
            TimePos::End => vec!["es gibt".into(), t_de, np.german(Case::Acc), l_de.into()],
            TimePos::None => vec!["es gibt".into(), np.german(Case::Acc), l_de.into()],
        };
        finish(en, de)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn german_numbers_put_units_before_tens_and_compound() {
        let cases = [
            (1, "eins"),
            (7, "sieben"),
            (16, "sechzehn"),
            (17, "siebzehn"),
            (20, "zwanzig"),
            (21, "einundzwanzig"),
            (30, "dreißig"),
            (36, "sechsunddreißig"),
            (77, "siebenundsiebzig"),
            (99, "neunundneunzig"),
            (100, "einhundert"),
            (101, "einhunderteins"),
            (111, "einhundertelf"),
            (121, "einhunderteinundzwanzig"),
            (342, "dreihundertzweiundvierzig"),
            (600, "sechshundert"),
            (717, "siebenhundertsiebzehn"),
            (999, "neunhundertneunundneunzig"),
        ];
        for (n, w) in cases {
            assert_eq!(german_number(n), w, "{n}");
        }
    }

    #[test]
    fn english_numbers_are_british_with_hyphens() {
        assert_eq!(english_number(21), "twenty-one");
        assert_eq!(english_number(40), "forty");
        assert_eq!(english_number(100), "one hundred");
        assert_eq!(english_number(342), "three hundred and forty-two");
        assert_eq!(english_number(905), "nine hundred and five");
    }

    #[test]
    fn ordinals_match_in_both_languages() {
        let cases = [
            (1, "first", "ersten"),
            (2, "second", "zweiten"),
            (3, "third", "dritten"),
            (7, "seventh", "siebten"),
            (8, "eighth", "achten"),
            (12, "twelfth", "zwölften"),
            (16, "sixteenth", "sechzehnten"),
            (20, "twentieth", "zwanzigsten"),
            (21, "twenty-first", "einundzwanzigsten"),
            (23, "twenty-third", "dreiundzwanzigsten"),
            (30, "thirtieth", "dreißigsten"),
            (31, "thirty-first", "einunddreißigsten"),
        ];
        for (n, en, de) in cases {
            assert_eq!(english_ordinal(n), en);
            assert_eq!(german_ordinal_dative(n), de);
        }
    }

    fn np(det: Det, adj: Option<(&'static str, &'static str)>, en: &str) -> NounPhrase {
        NounPhrase {
            det,
            adj,
            noun: NOUNS.iter().find(|n| n.en == en).unwrap(),
        }
    }

    #[test]
    fn one_inflects_for_gender_and_case_with_mixed_adjective_endings() {
        let red = Some(("red", "rot"));
        let check = |noun: &str, nom: &str, acc: &str, dat: &str| {
            let p = np(Det::Count(1), red, noun);
            assert_eq!(p.german(Case::Nom), nom);
            assert_eq!(p.german(Case::Acc), acc);
            assert_eq!(p.german(Case::Dat), dat);
        };
        check("dog", "ein roter Hund", "einen roten Hund", "einem roten Hund");
        check("cat", "eine rote Katze", "eine rote Katze", "einer roten Katze");
        check("horse", "ein rotes Pferd", "ein rotes Pferd", "einem roten Pferd");
        check("lion", "ein roter Löwe", "einen roten Löwen", "einem roten Löwen");
    }

    #[test]
    fn plural_counts_take_strong_endings_and_dative_n() {
        let p = np(Det::Count(3), Some(("small", "klein")), "dog");
        assert_eq!(p.english(), "three small dogs");
        assert_eq!(p.german(Case::Acc), "drei kleine Hunde");
        assert_eq!(p.german(Case::Dat), "drei kleinen Hunden");
        let p = np(Det::Count(21), None, "car");
        assert_eq!(p.german(Case::Dat), "einundzwanzig Autos");
        let p = np(Det::Count(2), None, "mouse");
        assert_eq!(p.english(), "two mice");
        assert_eq!(p.german(Case::Dat), "zwei Mäusen");
    }

    #[test]
    fn definite_phrases_take_weak_endings() {
        let p = np(
            Det::The {
                plural: true,
                count: Some(3),
            },
            Some(("red", "rot")),
            "cat",
        );
        assert_eq!(p.english(), "the three red cats");
        assert_eq!(p.german(Case::Nom), "die drei roten Katzen");
        assert_eq!(p.german(Case::Dat), "den drei roten Katzen");
        let p = np(
            Det::The {
                plural: false,
                count: None,
            },
            Some(("old", "alt")),
            "dog",
        );
        assert_eq!(p.german(Case::Nom), "der alte Hund");
        assert_eq!(p.german(Case::Acc), "den alten Hund");
        assert_eq!(p.german(Case::Dat), "dem alten Hund");
        let p = np(
            Det::The {
                plural: false,
                count: None,
            },
            Some(("old", "alt")),
            "horse",
        );
        assert_eq!(p.german(Case::Acc), "das alte Pferd");
        let p = np(
            Det::The {
                plural: false,
                count: None,
            },
            None,
            "cup",
        );
        assert_eq!(p.german(Case::Dat), "der Tasse");
    }

    #[test]
    fn sentences_are_well_formed() {
        let mut rng = SplitMix64::new(9);
        for _ in 0..2000 {
            let p = sentence(&mut rng);
            for s in [&p.english, &p.german] {
                assert!(s.ends_with('.'), "{s}");
                assert!(s.chars().next().unwrap().is_uppercase(), "{s}");
                assert!(!s.contains("  "), "{s}");
            }
            let words = p.english.split(' ').count();
            assert!((3..=24).contains(&words), "{}", p.english);
        }
    }
}
