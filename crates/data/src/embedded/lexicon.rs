//! The embedded task's words: nouns, adjectives, verbs, subjects, places and times, each with its
//! English and German forms. Data only; `grammar` decides how the words combine.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gender {
    Masc,
    Fem,
    Neut,
}
use Gender::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Case {
    Nom,
    Acc,
    Dat,
}

#[derive(Debug)]
pub(super) struct Noun {
    pub(super) en: &'static str,
    pub(super) en_pl: &'static str,
    pub(super) gender: Gender,
    /// Nominative singular.
    pub(super) de: &'static str,
    /// Accusative/dative singular (differs only for weak masculines: Löwe → Löwen).
    pub(super) de_oblique: &'static str,
    pub(super) de_pl: &'static str,
    pub(super) animate: bool,
}

impl Noun {
    pub(super) fn de_sg(&self, case: Case) -> &'static str {
        if case == Case::Nom {
            self.de
        } else {
            self.de_oblique
        }
    }

    /// Plural form; the dative plural adds -n unless the plural already ends in -n or -s.
    pub(super) fn de_plural(&self, case: Case) -> String {
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

pub(super) const NOUNS: &[Noun] = &[
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
pub(super) enum Fits {
    Any,
    Animate,
    Inanimate,
}

/// English adjective, German stem (endings are added by declension), what it may describe.
pub(super) const ADJECTIVES: &[(&str, &str, Fits)] = &[
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

pub(super) struct TransitiveVerb {
    pub(super) en: &'static str,
    pub(super) en_3sg: &'static str,
    /// ich, du, er/sie/es, wir, sie (plural).
    pub(super) de: [&'static str; 5],
    pub(super) animate_object: bool,
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

pub(super) const TRANSITIVE: &[TransitiveVerb] = &[
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
pub(super) const INTRANSITIVE: &[(&str, &str, &str, &str)] = &[
    ("sleep", "sleeps", "schläft", "schlafen"),
    ("run", "runs", "läuft", "laufen"),
    ("wait", "waits", "wartet", "warten"),
    ("play", "plays", "spielt", "spielen"),
    ("swim", "swims", "schwimmt", "schwimmen"),
    ("jump", "jumps", "springt", "springen"),
    ("sit", "sits", "sitzt", "sitzen"),
];

/// English subject, German subject, person index into `TransitiveVerb::de`.
pub(super) const SUBJECTS: &[(&str, &str, usize)] = &[
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

pub(super) const LOCATIONS: &[(&str, &str)] = &[
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

pub(super) const SIMPLE_TIMES: &[(&str, &str)] = &[
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

pub(super) const WEEKDAYS: &[(&str, &str)] = &[
    ("Monday", "Montag"),
    ("Tuesday", "Dienstag"),
    ("Wednesday", "Mittwoch"),
    ("Thursday", "Donnerstag"),
    ("Friday", "Freitag"),
    ("Saturday", "Samstag"),
    ("Sunday", "Sonntag"),
];

/// English, German, days in the month (29 for February: leap years exist).
pub(super) const MONTHS: &[(&str, &str, u32)] = &[
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
