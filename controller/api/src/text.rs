//! Text that came from elsewhere (a BMC, an agent, a file) quoted safely in messages: control
//! characters escaped, so an answer cannot move a terminal's cursor or forge a log line, and
//! length bounded, so one answer cannot fill a log, a report or a stored record.

use std::fmt::Write as _;

/// How many characters of foreign text a message quotes by default.
pub const EXCERPT_CHARS: usize = 256;

/// Whether `c` must not be printed raw: C0/C1 controls and DEL, and the invisible
/// direction and zero-width marks that can make a line read differently than it is.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `text` with control characters escaped (`\n`, `\u{1b}`) and cut after `max_chars`
/// characters of output, ending with `… (N more bytes)` when cut.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_add(32)));
    let mut shown = 0usize;
    for (at, c) in text.char_indices() {
        let piece: String = if needs_escape(c) {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        let width = piece.chars().count();
        if shown + width > max_chars {
            let _ = write!(out, "… ({} more bytes)", text.len() - at);
            return out;
        }
        shown += width;
        out.push_str(&piece);
    }
    out
}

/// Whether `text` holds a character [`excerpt`] escapes (a control character, an invisible
/// direction or zero-width mark).
pub fn has_control(text: &str) -> bool {
    text.chars().any(needs_escape)
}

/// `text` whole, with those characters escaped: for printing text that came from elsewhere.
pub fn escaped(text: &str) -> String {
    // No character escapes to more than `\u{10ffff}`: ten characters.
    excerpt(text, text.len().saturating_mul(10))
}

/// Cuts `text` in place to at most `max_bytes` bytes (at a character boundary), ending with
/// `…` when it was cut. A no-op for text that fits.
pub fn truncate_to(text: &mut String, max_bytes: usize) {
    if text.len() <= max_bytes {
        return;
    }
    let ellipsis = "…";
    let mut cut = max_bytes.saturating_sub(ellipsis.len());
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(ellipsis);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_is_cut() {
        assert_eq!(excerpt("plain text", 256), "plain text");
        assert_eq!(
            excerpt("red\u{1b}[31m\nline\u{202e}", 256),
            "red\\u{1b}[31m\\nline\\u{202e}"
        );
        let long = "\u{1b}[2J".repeat(100_000);
        let cut = excerpt(&long, 256);
        assert!(cut.chars().count() < 300, "{}", cut.len());
        assert!(cut.ends_with("more bytes)"), "{cut}");
        assert!(!cut.contains('\u{1b}'));
        assert_eq!(excerpt("ééé", 2), "éé… (2 more bytes)");
    }

    #[test]
    fn truncation_keeps_character_boundaries() {
        let mut text = "é".repeat(10);
        truncate_to(&mut text, 8);
        assert!(text.len() <= 8 && text.ends_with('…'), "{text}");
        let mut short = "fits".to_owned();
        truncate_to(&mut short, 8);
        assert_eq!(short, "fits");
    }
}
