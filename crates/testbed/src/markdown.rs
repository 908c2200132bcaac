//! What tests of the documentation share about Markdown as GitHub renders it.

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as
/// `-`.
pub fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}
