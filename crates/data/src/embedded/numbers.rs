//! Number words: English and German cardinals for 0–999 and ordinals for days of the month.

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
}
