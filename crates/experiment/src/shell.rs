//! Shell quoting, for the commands Ember prints for a user to run (resume a run, watch a
//! sweep) and writes into batch scripts.

/// `word`, quoted for a POSIX shell when it needs to be.
pub fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}
