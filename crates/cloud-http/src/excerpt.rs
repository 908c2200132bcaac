//! What of a remote party's text may go into a message: a cloud endpoint's answer (or a
//! tenant's API server's error) reaches conditions and Events, cluster-autoscaler's RPC errors
//! and the logs, so it is cut short and stripped of control characters (terminal escapes, line
//! breaks that forge log lines).

/// Most characters of an endpoint's text kept in a message.
pub const MAX_EXCERPT_CHARS: usize = 200;

/// `text` for a message: control characters replaced by spaces, runs of whitespace made
/// one, and cut at [`MAX_EXCERPT_CHARS`] characters, saying how long it was.
pub fn excerpt(text: &str) -> String {
    excerpt_within(text, MAX_EXCERPT_CHARS)
}

/// [`excerpt`] cut at `max_chars` characters instead.
pub fn excerpt_within(text: &str, max_chars: usize) -> String {
    let mut clean = String::with_capacity(text.len().min(max_chars * 4));
    let mut kept = 0usize;
    let mut space = false;
    let mut cut = false;
    for c in text.trim().chars() {
        let c = if c.is_control() || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' {
            if space {
                continue;
            }
            space = true;
        } else {
            space = false;
        }
        if kept == max_chars {
            cut = true;
            break;
        }
        clean.push(c);
        kept += 1;
    }
    if cut {
        format!("{}... ({} bytes in all)", clean.trim_end(), text.len())
    } else {
        clean
    }
}

/// A body that is not the API's JSON, for a message: its content type and length only (a
/// page of an unexpected server says nothing the API would, and may say what it should not).
pub fn opaque_body(content_type: Option<&str>, body: &[u8]) -> String {
    match content_type {
        Some(kind) => format!(
            "a {} body of {} bytes, not the API's JSON",
            excerpt(kind),
            body.len()
        ),
        None => format!("a body of {} bytes, not the API's JSON", body.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_short_and_has_no_control_characters() {
        let hostile = format!(
            "first\r\n\x1b[31mforged log line\x00{}",
            "x".repeat(1 << 20)
        );
        let text = excerpt(&hostile);
        assert!(
            text.chars().count() < MAX_EXCERPT_CHARS + 40,
            "{}",
            text.len()
        );
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.starts_with("first [31mforged log line x"), "{text:?}");
        assert!(
            text.ends_with(&format!("({} bytes in all)", hostile.len())),
            "{text}"
        );
        assert_eq!(excerpt("  Plan is out of stock  "), "Plan is out of stock");
    }

    #[test]
    fn an_opaque_body_is_named_by_type_and_size_only() {
        let text = opaque_body(Some("text/html"), b"<html>secret</html>");
        assert_eq!(text, "a text/html body of 19 bytes, not the API's JSON");
        assert_eq!(
            opaque_body(None, b"x"),
            "a body of 1 bytes, not the API's JSON"
        );
    }
}
