//! Printing errors: an error and its causes, one per line (STYLE.md, errors). Used by every
//! module that logs or prints an error, so none of them depends on the command line for it.

/// The error and its causes, one per line.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str("\n  caused by: ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn chain_puts_each_cause_on_its_own_line() {
        let inner = std::io::Error::other("disk full");
        let outer = anyhow::Error::new(inner).context("writing the seal key");
        let text = super::chain(outer.as_ref());
        assert_eq!(text, "writing the seal key\n  caused by: disk full");
    }
}
