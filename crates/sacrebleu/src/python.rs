//! Python's string semantics where they differ from Rust's defaults: sacreBLEU splits, strips
//! and lowercases with `str` methods, and a sentence must break into the same tokens here.

/// Python's `str.isspace()`, which `str.split()` and `str.rstrip()` use.
///
/// It is Rust's `char::is_whitespace` plus U+001C..U+001F (the information
/// separators, which Python counts as whitespace by their bidi class).  A
/// sentence containing one of them must split where sacreBLEU splits it.
pub(crate) fn is_py_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\u{1c}'..='\u{1f}'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// Python's `s.split()` (no argument): runs of whitespace separate, no empty
/// tokens.
pub(crate) fn py_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_space).filter(|t| !t.is_empty())
}

/// Python's `s.rstrip()` (no argument).
pub(crate) fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_py_space)
}

/// Python's `str.lower()`: full Unicode lowercase mapping including the
/// final-sigma rule, which Rust's `str::to_lowercase` also implements.
pub(crate) fn py_lower(s: &str) -> String {
    s.to_lowercase()
}

/// Python's `' '.join(s.split())`: tokens separated by single spaces.
pub(crate) fn join_py_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for token in py_split(text) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(token);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_includes_information_separators() {
        assert_eq!(
            py_split("a\u{1c}b\u{a0}c\u{3000}d \t").collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert!(
            !is_py_space('\u{200b}'),
            "zero-width space is not whitespace in Python"
        );
        assert_eq!(py_rstrip("x \u{1f}\u{2003}"), "x");
    }
}
