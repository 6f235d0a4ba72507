//! Header-safe values taken from the body and client headers.

const MAX_MODEL_LEN: usize = 256;

/// The model name, if it can travel as a header value unchanged.
pub fn model(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_MODEL_LEN
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b'|');
    ok.then(|| name.to_string())
}

/// Why a residency value was refused, in words for the client's 400.
#[derive(Debug, PartialEq, Eq)]
pub struct BadResidency(pub String);

/// A client's residency value: comma-separated region names of `[a-z0-9_-]`.
pub fn residency(value: &str) -> Result<String, BadResidency> {
    let regions: Vec<&str> = crate::contract::split_regions(value).collect();
    if regions.is_empty() {
        return Err(BadResidency("residency header is empty".into()));
    }
    for r in &regions {
        let ok = r.len() <= 64
            && r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(BadResidency(format!(
                "residency region '{r}' is not a region name ([a-z0-9_-], at most 64)"
            )));
        }
    }
    Ok(regions.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_that_cannot_be_headers_are_dropped() {
        assert_eq!(
            model("meta-llama/Llama-3-8B").as_deref(),
            Some("meta-llama/Llama-3-8B")
        );
        assert_eq!(model("a b"), None);
        assert_eq!(model("a|b"), None);
        assert_eq!(model(""), None);
        assert_eq!(model(&"x".repeat(300)), None);
    }

    #[test]
    fn residency_is_normalised_or_refused() {
        assert_eq!(residency(" us , eu ").unwrap(), "us,eu");
        assert!(residency("US").is_err());
        assert!(residency(",").is_err());
    }
}
