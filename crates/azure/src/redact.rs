//! Removes secrets from text before it is logged or put into an error:
//! SAS signatures (`sig=...`, also percent-encoded) and account keys
//! (`AccountKey=...`). SDK errors quote request URLs, which carry the SAS.

/// What replaces a secret value.
pub const REDACTED: &str = "REDACTED";

/// Markers after which a secret value follows, matched case-insensitively.
const SECRET_MARKERS: [&str; 3] = ["sig=", "sig%3d", "accountkey="];

/// Returns `text` with every SAS signature and account key replaced by
/// [`REDACTED`].
///
/// ```
/// use spot_worker_azure::redact;
/// let url = "http://127.0.0.1/q?sv=2021-08-06&sig=abc%2Bdef&se=x";
/// assert_eq!(redact(url), "http://127.0.0.1/q?sv=2021-08-06&sig=REDACTED&se=x");
/// assert_eq!(redact("AccountName=a;AccountKey=c2VjcmV0;"), "AccountName=a;AccountKey=REDACTED;");
/// ```
pub fn redact(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut search = 0;
    while let Some((start, marker)) = next_marker(&lower, search) {
        let value_start = start + marker.len();
        let value_end = text[value_start..]
            .find(is_value_end)
            .map_or(text.len(), |offset| value_start + offset);
        out.push_str(&text[copied..value_start]);
        if value_end > value_start {
            out.push_str(REDACTED);
        }
        copied = value_end;
        search = value_end.max(value_start);
    }
    out.push_str(&text[copied..]);
    out
}

fn next_marker(lower: &str, from: usize) -> Option<(usize, &'static str)> {
    SECRET_MARKERS
        .iter()
        .filter_map(|marker| lower[from..].find(marker).map(|at| (from + at, *marker)))
        .min_by_key(|(at, _)| *at)
}

/// Where a secret value ends: URL, connection-string, quoting or space
/// delimiters. Base64 characters (`+`, `/`, `=`) are part of the value.
fn is_value_end(c: char) -> bool {
    matches!(c, '&' | ';' | '"' | '\'' | '<' | '>' | ')' | ',' | '#') || c.is_whitespace()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_signatures_in_urls_and_error_text() {
        let text = "error sending request for url (http://h/q/messages?sv=1&SIG=a/b+c=&spr=https): refused";
        let out = redact(text);
        assert_eq!(
            out,
            "error sending request for url (http://h/q/messages?sv=1&SIG=REDACTED&spr=https): refused"
        );
    }

    #[test]
    fn redacts_percent_encoded_signatures_and_every_occurrence() {
        let out = redact("a?x=1%26sig%3Dsecret1 b?sig=secret2");
        assert!(
            !out.contains("secret1") && !out.contains("secret2"),
            "{out}"
        );
    }

    #[test]
    fn redacts_account_keys_in_connection_strings() {
        let out = redact(
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc+/==;EndpointSuffix=x",
        );
        assert_eq!(
            out,
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=REDACTED;EndpointSuffix=x"
        );
    }

    #[test]
    fn leaves_other_text_alone() {
        assert_eq!(
            redact("signal=1 design=2 ünïcode"),
            "signal=1 design=2 ünïcode"
        );
    }
}
