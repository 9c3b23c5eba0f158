//! The embedded task's grammar: noun phrases declined for case, time phrases, and whole
//! sentences with German word order (see the grammar in the parent module's docs).

use ember_rng::SplitMix64;

use super::lexicon::Gender::*;
use super::lexicon::*;
use super::numbers::{english_number, english_ordinal, german_number, german_ordinal_dative};
use super::Pair;

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
